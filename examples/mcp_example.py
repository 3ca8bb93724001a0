"""`ptc mcp` from an MCP client: start it over stdio with an upstream MCP server, call upstream
tools from one script. Run: ``python examples/mcp_example.py``.

The upstream here is the test suite's small weather server; any stdio MCP server works, e.g.
``ptc mcp --upstream "npx -y @modelcontextprotocol/server-filesystem /data"``.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

UPSTREAM = Path(__file__).resolve().parent.parent / "tests" / "integrations" / "upstream_server.py"
CODE = """import asyncio, tools
found = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in ["Paris", "Oslo", "Lima"]))
print(max(found, key=lambda w: w["temp_c"])["city"])
try:
    tools.get_weather(city="Atlantis")
except tools.ToolError as exc:
    print("upstream error:", exc)
"""


async def main() -> None:
    upstream = shlex.join([sys.executable, str(UPSTREAM)])
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "sandbox.cli", "mcp", "--upstream", upstream]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        stubs = await session.read_resource("ptc://stubs/compact")
        print("stubs the model reads:")
        print(next(c.text for c in stubs.contents if isinstance(c, mcp_types.TextResourceContents)))
        result = await session.call_tool("execute_python", {"code": CODE})
        assert isinstance(result, mcp_types.CallToolResult)
        print("\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent)))


if __name__ == "__main__":
    asyncio.run(main())
