"""Upstream MCP servers: start each one over stdio, list its tools, forward calls to it.

`connect_upstream` opens a `ClientSession` (official `mcp` SDK) to a server started from a
command line and returns its tools as `ForwardedTool`s: the stub comes from the tool's MCP
`inputSchema`/`outputSchema`, and a call from a script travels script → broker (validation,
policy, call log) → client-mode handler → this forwarder → the upstream session. The session
lives on the event loop that opened it; the forwarder may be called from another loop (the
embedded engine's, the gRPC client's), so each call is handed to the session's loop.

An upstream may be named (`parse_upstream`: ``NAME=COMMAND ...``): its tools are then offered
as ``NAME__TOOL`` (`prefixed`), so two servers that offer the same tool names (two filesystem
servers on different directories) can be used together. That prefixed name is the tool's name in
the manifest: the stubs show it, the script calls it and the call log records it; the upstream
is called with its own name. An unnamed upstream's tools keep their own names.

A server that cannot start (a missing command, one that exits or fails its MCP handshake)
is one `InvalidArgument` naming the upstream; its own error output has already gone to stderr.

What the script sees: the tool's `structuredContent` when it sends one; else, when the answer
carries anything besides text (images, audio, embedded resources, resource links), the list of
its content items as typed dicts (`content_item`, documented in the stubs by `stubs_gen.content`:
binary data as base64 text, since only JSON crosses the sandbox boundary); else its text
content parsed as JSON when it is JSON, else the text. An `isError` result or a failure of the
session raises `UpstreamToolError` here, which the broker records as the call's error and the
script receives as `tools.ToolError`. Results of any size take the same path as every tool's
(the broker's result cap, the call log's budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
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

__all__ = [
    "PREFIX_SEPARATOR",
    "Upstream",
    "UpstreamSpec",
    "UpstreamToolError",
    "call_result_value",
    "connect_upstream",
    "content_item",
    "parse_upstream",
    "prefixed",
]

PREFIX_SEPARATOR = "__"
# No "__" inside and no "_" at the end: the first "__" of NAME__TOOL is always the separator.
_NAME = r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*"
_NAMED = re.compile(rf"({_NAME})=(.*)\Z", re.DOTALL)
# A first word with "=" in it was meant as a name (no command is called "a-b=npx").
_LOOKS_NAMED = re.compile(r"""([^\s='"/]+)=""")


class UpstreamToolError(ToolFailure):
    """An upstream tool answered with `isError`, or the upstream session failed."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One ``--upstream``: the command line, and the name that prefixes its tools (or None)."""

    command: str
    name: str | None = None

    @property
    def label(self) -> str:
        """How errors name it: as the user wrote it."""
        return f"{self.name}={self.command}" if self.name else self.command


def parse_upstream(text: str) -> UpstreamSpec:
    """``NAME=COMMAND ...`` (a named upstream) or ``COMMAND ...``; a bad name is refused."""
    named = _NAMED.match(text)
    if named:
        return UpstreamSpec(named.group(2).strip(), named.group(1))
    looks = _LOOKS_NAMED.match(text)
    if looks:
        raise InvalidArgument(
            f"--upstream {text!r}: {looks.group(1)!r} is not a valid upstream name (letters and "
            "digits, single '_' between them, starting with a letter: e.g. docs=\"npx ...\")"
        )
    return UpstreamSpec(text.strip())


def prefixed(name: str | None, tool: str) -> str:
    """The manifest name of an upstream's tool: ``NAME__TOOL`` for a named upstream."""
    return f"{name}{PREFIX_SEPARATOR}{tool}" if name else tool


@dataclass
class Upstream:
    command: str
    session: ClientSession
    tools: list[ForwardedTool]
    server_name: str
    name: str | None = None


def content_item(block: Any) -> dict[str, Any]:
    """One content block of an answer as the script gets it (``McpText``, ``McpImage``,
    ``McpAudio``, ``McpResource``, ``McpResourceLink`` in the stubs): plain JSON, binary data
    as base64 text under ``data``, the MIME type under ``mime_type``."""
    if isinstance(block, mcp_types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "data": block.data}
    if isinstance(block, mcp_types.EmbeddedResource):
        inner = block.resource
        item: dict[str, Any] = {"type": "resource", "uri": str(inner.uri)}
        item["mime_type"] = inner.mime_type
        if isinstance(inner, mcp_types.TextResourceContents):
            item["text"] = inner.text
        else:
            item["data"] = inner.blob
        return item
    if isinstance(block, mcp_types.ResourceLink):
        return {
            "type": "resource_link",
            "uri": str(block.uri),
            "name": block.name,
            "mime_type": block.mime_type,
            "description": block.description,
        }
    # A kind this SDK does not model: its JSON as sent, never a placeholder string.
    dumped: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _describe(block: Any) -> str:
    """A non-text block in an error message (its data is not the error)."""
    item = content_item(block)
    what = item.get("mime_type") or item.get("uri") or ""
    return f"[{item.get('type', 'unknown')} content{': ' + what if what else ''}]"


def call_result_value(name: str, result: Any) -> Any:
    """The script's view of one `CallToolResult`; raises `UpstreamToolError` for an error."""
    if not isinstance(result, mcp_types.CallToolResult):
        raise UpstreamToolError(f"{name}: the upstream server did not complete the call")
    blocks = list(result.content)
    only_text = all(isinstance(b, mcp_types.TextContent) for b in blocks)
    if result.is_error:
        text = "\n".join(
            b.text if isinstance(b, mcp_types.TextContent) else _describe(b) for b in blocks
        )
        raise UpstreamToolError(text or f"{name}: the upstream tool failed")
    if result.structured_content is not None:
        return result.structured_content
    if not only_text:
        return [content_item(b) for b in blocks]
    text = "\n".join(b.text for b in blocks if isinstance(b, mcp_types.TextContent))
    try:
        return json.loads(text)
    except ValueError:
        return text


async def connect_upstream(
    stack: AsyncExitStack,
    command: str | Sequence[str] | UpstreamSpec,
    errlog: TextIO | None = None,
) -> Upstream:
    """Starts ``command``, initialises an MCP session, and lists the server's tools. Whatever
    goes wrong on the way is one `InvalidArgument` naming the upstream; what was started for it
    is stopped again."""
    if isinstance(command, UpstreamSpec):
        spec = command
    else:
        spec = UpstreamSpec(command if isinstance(command, str) else shlex.join(command))
    argv = shlex.split(spec.command)
    if not argv:
        raise InvalidArgument(f"--upstream {spec.label!r}: empty command")
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    # Its own stack: a failed start is unwound here, so its errors never reach the caller's.
    own = AsyncExitStack()
    try:
        read, write = await own.enter_async_context(
            stdio_client(params, errlog=errlog or sys.stderr)
        )
        session = await own.enter_async_context(ClientSession(read, write))
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
    except Exception as exc:  # any failure to start is the upstream's, said once
        reason = _reason(exc)
        with contextlib.suppress(Exception):  # its stop adds nothing to say
            await own.aclose()
        raise InvalidArgument(f"--upstream {spec.label!r}: {reason}") from None
    stack.push_async_exit(own)
    loop = asyncio.get_running_loop()
    tools = [_forward(session, loop, tool, spec.name) for tool in listed]
    return Upstream(spec.command, session, tools, init.server_info.name, spec.name)


def _reason(exc: BaseException) -> str:
    """One line for a failed start: the innermost cause out of anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError):
        return str(exc)  # [Errno 2] No such file or directory: 'cmd'
    detail = str(exc) or type(exc).__name__
    if "closed" in detail.lower():
        return (
            f"the server stopped before it finished starting ({detail}); its own error "
            "output, if any, is above"
        )
    return f"the server failed to start: {type(exc).__name__}: {detail}"


def _forward(
    session: ClientSession,
    loop: asyncio.AbstractEventLoop,
    tool: mcp_types.Tool,
    prefix: str | None,
) -> ForwardedTool:
    name = tool.name  # the upstream's own name: what it is called with
    shown = prefixed(prefix, name)  # the manifest's name: stubs, broker and call log

    async def call_here(arguments: dict[str, Any]) -> Any:
        try:
            result = await session.call_tool(name, arguments)
        except UpstreamToolError:
            raise
        except Exception as exc:  # the session failed: still the call's error, not ours
            raise UpstreamToolError(f"{shown}: {type(exc).__name__}: {exc}") from exc
        return call_result_value(shown, result)

    async def forward(arguments: dict[str, Any]) -> Any:
        future = asyncio.run_coroutine_threadsafe(call_here(arguments), loop)
        return await asyncio.wrap_future(future)

    read_only = bool(tool.annotations and tool.annotations.read_only_hint)
    return forwarded_tool(
        shown,
        forward,
        description=tool.description or "",
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        options={"read_only": read_only, "mcp_content": True},
    )
