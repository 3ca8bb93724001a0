"""An upstream MCP server for the tests of `ptc mcp --upstream`, run as `python upstream_server.py`.

Its tools: `get_weather` (structured result; fails for an unknown city), `add` (a plain int
result), `shout` (text content) and `explode` (an unexpected exception). stdio transport.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server: MCPServer[Any] = MCPServer("upstream-weather", log_level="WARNING")
CITIES = {"Paris": 21.5, "Oslo": 4.0, "Lima": 18.0}


@server.tool()
def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    if city not in CITIES:
        raise ToolError(f"unknown city: {city}")
    return {"city": city, "temp_c": CITIES[city], "sky": "clear"}


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-cases a text."""
    return text.upper()


@server.tool()
def explode() -> str:
    """Always fails."""
    raise RuntimeError("boom")


if __name__ == "__main__":
    server.run("stdio")
