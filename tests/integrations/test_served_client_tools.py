"""Defect 1: tools that run in the calling process, while the script runs on a server.

`ptc mcp --server` forwards every upstream MCP tool call from the server's sandbox back to the
`ptc mcp` process over the stream, and smolagents' `SandboxExecutor` over a `ClientRunner` serves
the agent's tools (and `final_answer`) from the agent's process: neither answers such a call
with "a forwarded tool has no local function". Real things throughout: a `ptc serve`
subprocess on an ephemeral loopback port, `ptc mcp` driven by the official MCP client over stdio,
the test's upstream MCP server, and a real `CodeAgent`.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types
from smolagents import CodeAgent

from sandbox.integrations import ClientRunner
from sandbox.integrations.smolagents import SandboxExecutor
from tests.integrations.integration_support import PYTHON, UPSTREAM_SERVER, leftover_children
from tests.integrations.test_mcp_server import SCRIPT
from tests.integrations.test_mcp_session import assert_state_kept_across_two_calls
from tests.integrations.test_smolagents import CALLS, STEP_1, STEP_2, ScriptedModel, get_weather
from tests.ptc_serve import ptc_serve

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with ptc_serve("--pool-size", "2", "--audit-db", "memory") as serving:
        yield serving.address
    assert leftover_children() == []


def _text(result: Any) -> str:
    assert isinstance(result, mcp_types.CallToolResult)
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def test_ptc_mcp_with_server_serves_upstream_tools_from_the_client(address: str) -> None:
    upstream = shlex.join([PYTHON, str(UPSTREAM_SERVER)])
    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "sandbox.cli", "mcp", "--server", address, "--upstream", upstream],
        cwd=str(ROOT),
    )

    async def work() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("execute_python", {"code": SCRIPT})

    called = asyncio.run(asyncio.wait_for(work(), 100))
    text = _text(called)
    assert not called.is_error, text
    assert "no local function" not in text
    assert "[('Lima', 18.0), ('Oslo', 4.0), ('Paris', 21.5)]" in text
    assert "42 HI" in text
    assert "typed: ToolError True" in text and "unknown city: Atlantis" in text
    assert "crash: ToolError" in text
    assert "7 tool calls (2 error, 5 ok)" in text


def test_ptc_mcp_with_server_serves_named_upstreams_and_their_content(address: str) -> None:
    """Named upstreams with the same tool names, and an answer with an image and resources,
    through `ptc serve`: the prefixed names reach the server's manifest and call log, and the
    typed items cross the stream as JSON."""
    from tests.integrations.test_mcp_upstreams import CONTENT_SCRIPT, NAMED

    params = StdioServerParameters(
        command=PYTHON,
        args=["-m", "sandbox.cli", "mcp", "--server", address, *NAMED],
        cwd=str(ROOT),
    )
    code = (
        CONTENT_SCRIPT
        + "print(tools.beta__read_file(path='b'), tools.alpha__read_file(path='a'))\n"
    )

    async def work() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("execute_python", {"code": code})

    called = asyncio.run(asyncio.wait_for(work(), 100))
    text = _text(called)
    assert not called.is_error, text
    assert "['text', 'image', 'audio', 'resource', 'resource', 'resource_link']\n" in text
    assert "file:///alpha/data.bin None [0, 255, 1] False\n" in text
    assert "beta:b alpha:a\n" in text
    assert '#2 beta__read_file({"path":"b"}) -> ok "beta:b"' in text


def test_smolagents_executor_over_a_client_runner(address: str) -> None:
    CALLS.clear()
    model = ScriptedModel([STEP_1, STEP_2])
    with ClientRunner.connect(address) as runner:
        agent = CodeAgent(
            tools=[get_weather],
            model=model,
            executor=SandboxExecutor(runner),
            max_steps=4,
            verbosity_level=0,
        )
        answer = agent.run("Which city is warmest, and how humid is it?")
    assert answer == "Quito, humidity 40"  # final_answer came back through the stream
    assert CALLS == ["Oslo", "Rome", "Quito", "Quito"]  # the tool ran here, in this process
    assert "warmest: Quito" in str(model.seen[1])


def test_ptc_mcp_session_over_a_server_keeps_state_and_closes_it(address: str) -> None:
    assert_state_kept_across_two_calls(
        StdioServerParameters(
            command=PYTHON,
            args=["-m", "sandbox.cli", "mcp", "--server", address, "--session"],
            cwd=str(ROOT),
        )
    )
    # The conversation's session lived on the server and ended with the conversation.
    with ClientRunner.connect(address) as runner:
        sessions = runner.client.list_sessions(include_ended=True)
    assert [(s.state, len(s.execution_ids)) for s in sessions] == [("closed", 2)]
