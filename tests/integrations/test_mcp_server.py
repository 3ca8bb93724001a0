"""`ptc mcp` end to end: a real MCP client session (official SDK, stdio) drives `ptc mcp`, whose
tools come from an upstream MCP server written for the test (stdio); scripts call them."""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from integration_support import PYTHON, UPSTREAM_SERVER, leftover_children
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

SCRIPT = """\
import asyncio, tools
weather = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in ["Paris", "Oslo", "Lima"]))
print(sorted((w["city"], w["temp_c"]) for w in weather))
print(tools.add(a=2, b=40)["result"], tools.shout(text="hi"))
try:
    tools.get_weather(city="Atlantis")
except tools.ToolError as exc:
    print("typed:", type(exc).__name__, isinstance(exc, tools.ToolError), exc)
try:
    tools.explode()
except tools.ToolError as exc:
    print("crash:", type(exc).__name__)
"""


async def _session(work: Any) -> Any:
    upstream = shlex.join([PYTHON, str(UPSTREAM_SERVER)])
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "sandbox.cli", "mcp", "--upstream", upstream]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return await work(session)


def _text(result: Any) -> str:
    assert isinstance(result, mcp_types.CallToolResult)
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def test_ptc_mcp_runs_scripts_over_upstream_tools() -> None:
    async def work(session: ClientSession) -> Any:
        listed = await session.list_tools()
        called = await session.call_tool("execute_python", {"code": SCRIPT})
        failing = await session.call_tool(
            "execute_python", {"code": "import tools\ntools.get_weather(city='Nowhere')"}
        )
        compact = await session.read_resource("ptc://stubs/compact")
        module = await session.read_resource("ptc://stubs/module")
        return listed, called, failing, compact, module

    listed, called, failing, compact, module = asyncio.run(asyncio.wait_for(_session(work), 100))

    [tool] = listed.tools
    assert tool.name == "execute_python"
    assert tool.input_schema["required"] == ["code"]
    assert "def get_weather(*, city: str)" in (tool.description or "")
    assert "def add(*, a: int, b: int) -> AddResult:" in (tool.description or "")

    assert not called.is_error
    text = _text(called)
    assert "[('Lima', 18.0), ('Oslo', 4.0), ('Paris', 21.5)]" in text
    assert "42 HI" in text
    assert "typed: ToolError True" in text and "unknown city: Atlantis" in text
    assert "crash: ToolError" in text
    # Every forwarded call is in the call log, failures included.
    assert "7 tool calls (2 error, 5 ok)" in text
    assert '#4 add({"a":2,"b":40}) -> ok {"result":42}' in text
    assert 'get_weather({"city":"Atlantis"}) -> error' in text

    assert failing.is_error
    failing_text = _text(failing)
    assert "status: error" in failing_text and "unknown city: Nowhere" in failing_text

    [compact_text] = compact.contents
    assert isinstance(compact_text, mcp_types.TextResourceContents)
    assert "def shout(*, text: str):" in compact_text.text
    [module_text] = module.contents
    assert isinstance(module_text, mcp_types.TextResourceContents)
    assert "return _call('get_weather'" in module_text.text
    assert leftover_children() == []


def test_ptc_mcp_with_a_manifest_and_no_upstream() -> None:
    async def work(session: ClientSession) -> Any:
        return await session.call_tool("execute_python", {"code": "print(sum(range(10)))"})

    async def run() -> Any:
        params = StdioServerParameters(command=PYTHON, args=["-m", "sandbox.cli", "mcp"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    result = asyncio.run(asyncio.wait_for(run(), 100))
    assert "45" in _text(result) and "status: ok" in _text(result)
    assert leftover_children() == []
