"""Upstream MCP servers: start each one over stdio, list its tools, forward calls to it.

`connect_upstream` opens a `ClientSession` (official `mcp` SDK) to a server started from a
command line and returns its tools as `ForwardedTool`s: the stub comes from the tool's MCP
`inputSchema`/`outputSchema`, and a call from a script travels script → broker (validation,
policy, call log) → client-mode handler → this forwarder → the upstream session. The session
lives on the event loop that opened it; the forwarder may be called from another loop (the
embedded engine's, the gRPC client's), so each call is handed to the session's loop.

What the script sees: the tool's `structuredContent` when it sends one, else its text content
parsed as JSON when it is JSON, else the text. An `isError` result or a failure of the session
raises `UpstreamToolError` here, which the broker records as the call's error and the script
receives as `tools.ToolError`.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp import types as mcp_types

from sandbox.errors import InvalidArgument
from sandbox.handlers import ToolFailure
from sandbox.integrations.forwarded import ForwardedTool, forwarded_tool

__all__ = ["Upstream", "UpstreamToolError", "call_result_value", "connect_upstream"]


class UpstreamToolError(ToolFailure):
    """An upstream tool answered with `isError`, or the upstream session failed."""


@dataclass
class Upstream:
    command: str
    session: ClientSession
    tools: list[ForwardedTool]
    server_name: str


def call_result_value(name: str, result: Any) -> Any:
    """The script's view of one `CallToolResult`; raises `UpstreamToolError` for an error."""
    if not isinstance(result, mcp_types.CallToolResult):
        raise UpstreamToolError(f"{name}: the upstream server did not complete the call")
    texts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            texts.append(block.text)
        else:
            texts.append(f"[{block.type} content]")
    text = "\n".join(texts)
    if result.is_error:
        raise UpstreamToolError(text or f"{name}: the upstream tool failed")
    if result.structured_content is not None:
        return result.structured_content
    try:
        return json.loads(text)
    except ValueError:
        return text


async def connect_upstream(
    stack: AsyncExitStack, command: str | Sequence[str], errlog: TextIO | None = None
) -> Upstream:
    """Starts ``command``, initialises an MCP session, and lists the server's tools."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise InvalidArgument("--upstream: empty command")
    text = command if isinstance(command, str) else shlex.join(argv)
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    try:
        read, write = await stack.enter_async_context(
            stdio_client(params, errlog=errlog or sys.stderr)
        )
        session = await stack.enter_async_context(ClientSession(read, write))
        init = await session.initialize()
        listed: list[mcp_types.Tool] = []
        cursor: str | None = None
        while True:
            params_page = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params_page)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"--upstream {text!r}: {exc}") from exc
    loop = asyncio.get_running_loop()
    tools = [_forward(session, loop, tool) for tool in listed]
    return Upstream(text, session, tools, init.server_info.name)


def _forward(
    session: ClientSession, loop: asyncio.AbstractEventLoop, tool: mcp_types.Tool
) -> ForwardedTool:
    name = tool.name

    async def call_here(arguments: dict[str, Any]) -> Any:
        try:
            result = await session.call_tool(name, arguments)
        except UpstreamToolError:
            raise
        except Exception as exc:  # the session failed: still the call's error, not ours
            raise UpstreamToolError(f"{name}: {type(exc).__name__}: {exc}") from exc
        return call_result_value(name, result)

    async def forward(arguments: dict[str, Any]) -> Any:
        future = asyncio.run_coroutine_threadsafe(call_here(arguments), loop)
        return await asyncio.wrap_future(future)

    read_only = bool(tool.annotations and tool.annotations.read_only_hint)
    return forwarded_tool(
        name,
        forward,
        description=tool.description or "",
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        options={"read_only": read_only},
    )
