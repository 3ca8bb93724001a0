"""`ptc mcp`: the sandbox as an MCP server (official `mcp` SDK), over stdio or streamable HTTP.

It exposes one tool, `execute_python` (the execute tool: its description carries the compact
stub module; the files a script writes under outputs/ come back as embedded resources beside
the text, which lists them and any that were omitted), and the stubs as resources
(`ptc://stubs/compact`, what the model reads; `ptc://stubs/module`, the module the script
imports). The tools a script may call come from a
manifest (`--tools`) and from upstream MCP servers (`--upstream "COMMAND ..."`, repeatable): each
upstream is started over stdio, its tools become stubs, and every stub call is forwarded to it
as a client-mode call — validated by the broker and recorded in the call log like any other.
An agent then calls many upstream tools from one script instead of one tool per turn. A named
upstream (`--upstream docs="COMMAND ..."`) offers its tools as `docs__TOOL`, so servers that offer
the same tool names can be used together (`sandbox.integrations.mcp_upstream`).

A script that runs longer than a second sends MCP progress notifications (elapsed seconds, and
the status line as the message) to a caller that passed a progress token.

Scripts run on an embedded engine (the process backend) unless `--server` names a `ptc serve`
to run them on; either way through a `ScriptRunner`.

Authentication follows `ptc serve`'s rule: streamable HTTP on anything but a loopback address
needs a tenants file (`--tenants`, the same TOML and key hashes as `ptc serve --tenants`), and
every HTTP request must then carry ``Authorization: Bearer <API key>`` of one of its tenants;
anything else gets 401 before the MCP layer sees it. Without a tenants file it refuses to start
on a non-loopback host. (The tenants' limits and quotas are not applied here: point `--server`
at a `ptc serve` with the same tenants for that.)
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import mimetypes
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.types import BlobResourceContents, ContentBlock, EmbeddedResource, TextContent

from sandbox.client.tools import ToolLike
from sandbox.errors import InvalidArgument, Unauthenticated
from sandbox.expectations import ExpectedCalls
from sandbox.integrations.execute_tool import ExecuteTool, Observation
from sandbox.integrations.mcp_upstream import UpstreamSpec, connect_upstream, parse_upstream
from sandbox.integrations.runners import ScriptRunner
from sandbox.limits import Limits
from sandbox.telemetry.live import format_status
from sandbox.telemetry.progress import ProgressSnapshot
from stubs_gen import render_module

__all__ = [
    "BearerAuth",
    "McpOptions",
    "build_mcp_server",
    "check_exposure",
    "parse_upstreams",
    "serve_mcp",
]

STUBS_COMPACT_URI = "ptc://stubs/compact"
STUBS_MODULE_URI = "ptc://stubs/module"


@dataclass
class McpOptions:
    transport: Literal["stdio", "streamable-http"] = "stdio"
    host: str = "127.0.0.1"
    port: int = 8765
    tools: list[ToolLike] = field(default_factory=list)
    upstream: list[str] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    expected_calls: tuple[ExpectedCalls, ...] = ()
    tool_name: str = "execute_python"
    tenants: str | None = None  # tenants TOML: HTTP callers must present one of its API keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(options: McpOptions) -> Any:
    """Refuses streamable HTTP on a non-loopback host without a tenants file; returns the
    tenants registry that authenticates HTTP callers (None: no authentication, loopback only).
    Called before anything starts, so a refused configuration starts nothing."""
    if options.transport != "streamable-http":
        return None
    if options.tenants is None:
        if not is_loopback(options.host):
            raise InvalidArgument(
                f"--host {options.host} is not a loopback address, and without a tenants file "
                "nothing authenticates callers; pass --tenants TOML or use --host 127.0.0.1"
            )
        return None
    from sandbox.tenants import load_tenancy

    return load_tenancy(options.tenants)


class BearerAuth:
    """ASGI middleware: every HTTP request must authenticate against ``registry`` (a
    `TenantRegistry`: ``Authorization: Bearer <API key>``, keys checked against its hashes)."""

    def __init__(self, app: Any, registry: Any) -> None:
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            self.registry.authenticate(headers)
        except Unauthenticated as exc:
            body = json.dumps({"error": "unauthenticated", "detail": exc.message}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b'Bearer realm="ptc-mcp"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def build_mcp_server(execute: ExecuteTool, name: str = "ptc-sandbox") -> MCPServer[Any]:
    """An `MCPServer` with `execute_python` and the stub resources of ``execute``."""
    server: MCPServer[Any] = MCPServer(
        name,
        instructions="Call many tools from one Python script with the execute tool.",
        log_level="WARNING",
    )
    module = render_module(execute.manifest)

    async def execute_python(code: str, ctx: Context[Any]) -> list[ContentBlock]:
        # Long runs send progress notifications (when the caller asked for them with a
        # progress token): elapsed seconds as the progress, the status line as the message.
        loop = asyncio.get_running_loop()

        def progress(now: ProgressSnapshot) -> None:  # called on a runner's thread
            if loop.is_closed():
                return
            report = ctx.report_progress(round(now.elapsed_s, 1), None, format_status(now))
            asyncio.run_coroutine_threadsafe(report, loop)

        observation = await execute.arun(code, on_progress=progress)
        if observation.is_error:
            raise McpToolError(observation.text)
        return [TextContent(type="text", text=observation.text), *output_resources(observation)]

    server.add_tool(
        execute_python,
        name=execute.name,
        description=execute.description,
        structured_output=False,
    )

    @server.resource(
        STUBS_COMPACT_URI,
        name="stubs-compact",
        description="The tools a script may call, in the compact form a model reads.",
        mime_type="text/x-python",
    )
    def stubs_compact() -> str:
        return execute.stubs

    @server.resource(
        STUBS_MODULE_URI,
        name="stubs-module",
        description="The full typed stub module a script imports as `tools`.",
        mime_type="text/x-python",
    )
    def stubs_module() -> str:
        return module

    return server


def output_resources(observation: Observation) -> list[ContentBlock]:
    """The files the script wrote under outputs/, as embedded resources
    (``ptc://outputs/<execution id>/<name>``); the text already lists them and any omitted."""
    result = observation.result
    if result is None:
        return []
    blocks: list[ContentBlock] = []
    for output in result.output_files:
        mime = mimetypes.guess_type(output.name)[0] or "application/octet-stream"
        resource = BlobResourceContents(
            uri=f"ptc://outputs/{result.execution_id}/{quote(output.name)}",
            mime_type=mime,
            blob=base64.b64encode(output.data).decode("ascii"),
        )
        blocks.append(EmbeddedResource(type="resource", resource=resource))
    return blocks


def parse_upstreams(texts: list[str]) -> list[UpstreamSpec]:
    """Every ``--upstream``, parsed (`parse_upstream`); two upstreams of one name are refused."""
    specs = [parse_upstream(text) for text in texts]
    named: dict[str, UpstreamSpec] = {}
    for spec in specs:
        if spec.name is None:
            continue
        if spec.name in named:
            raise InvalidArgument(
                f"--upstream {spec.label!r}: the name {spec.name!r} is already given to "
                f"--upstream {named[spec.name].label!r}"
            )
        named[spec.name] = spec
    return specs


def load_tools_file(text: str) -> list[ToolLike]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"--tools: not JSON: {exc}") from exc
    entries = data.get("tools") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidArgument("--tools: expected an array of tool definitions or {tools: [...]}")
    return list(entries)


async def serve_mcp(runner: ScriptRunner, options: McpOptions) -> None:
    """Connects the upstreams, then serves until the transport ends."""
    registry = check_exposure(options)
    refused: InvalidArgument | None = None
    async with AsyncExitStack() as stack:
        try:
            tools = await _connect_upstreams(stack, options)
        except InvalidArgument as exc:
            # Raised once the upstreams already started are stopped, not through their exits:
            # an error passing an anyio task group's exit comes out wrapped in an exception group.
            refused = exc
        else:
            execute = ExecuteTool(
                runner,
                tools,
                name=options.tool_name,
                limits=options.limits,
                expected_calls=options.expected_calls,
            )
            server = build_mcp_server(execute)
            if options.transport == "stdio":
                await server.run_stdio_async()
            else:
                await _serve_http(server, options, registry)
    if refused is not None:
        raise refused


async def _connect_upstreams(stack: AsyncExitStack, options: McpOptions) -> list[ToolLike]:
    """The manifest's tools and every upstream's, each upstream started on ``stack``."""
    tools: list[ToolLike] = list(options.tools)
    seen = {_name(t) for t in tools}
    for spec in parse_upstreams(options.upstream):
        upstream = await connect_upstream(stack, spec)
        for tool in upstream.tools:
            if tool.name in seen:
                hint = (
                    ""
                    if spec.name
                    else '; name each upstream (--upstream NAME="COMMAND ...") to offer its '
                    "tools as NAME__TOOL"
                )
                raise InvalidArgument(
                    f"--upstream {spec.label!r}: tool {tool.name!r} is already provided{hint}"
                )
            seen.add(tool.name)
            tools.append(tool)
    return tools


async def _serve_http(server: MCPServer[Any], options: McpOptions, registry: Any) -> None:
    import uvicorn

    app: Any = server.streamable_http_app(host=options.host)
    if registry is not None:
        app = BearerAuth(app, registry)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning")
    await uvicorn.Server(config).serve()


def _name(tool: ToolLike) -> str:
    if isinstance(tool, dict):
        inner = tool.get("function") if tool.get("type") == "function" else None
        source = inner if isinstance(inner, dict) else tool
        return str(source.get("name", ""))
    return str(getattr(tool, "name", getattr(tool, "__name__", "")))
