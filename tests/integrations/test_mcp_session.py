"""`ptc mcp --session`: the execute tool keeps state across calls of one MCP conversation."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

from tests.integrations.integration_support import PYTHON, leftover_children


def _text(result: Any) -> str:
    assert isinstance(result, mcp_types.CallToolResult)
    return "\n".join(b.text for b in result.content if isinstance(b, mcp_types.TextContent))


def assert_state_kept_across_two_calls(params: StdioServerParameters) -> None:
    """Two execute calls of one MCP conversation with ``ptc mcp ... --session``: the second
    sees what the first defined."""

    async def run() -> list[str]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            out = []
            for code in ("import math\nr = 2", "print(round(math.pi * r * r, 2))"):
                out.append(_text(await session.call_tool("execute_python", {"code": code})))
            return out

    first, second = asyncio.run(asyncio.wait_for(run(), 100))
    assert "status: ok" in first
    assert "12.57" in second and "status: ok" in second


def test_ptc_mcp_session_keeps_state_across_calls() -> None:
    assert_state_kept_across_two_calls(
        StdioServerParameters(command=PYTHON, args=["-m", "sandbox.cli", "mcp", "--session"])
    )
    assert leftover_children() == []


def test_ptc_mcp_session_refuses_http() -> None:
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "mcp", "--session", "--transport", "streamable-http"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--session: only with --transport stdio" in done.stderr
