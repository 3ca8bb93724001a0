"""`ptc mcp`: the sandbox as an MCP server (official `mcp` SDK), over stdio or streamable HTTP.

It exposes one tool, `execute_python` (the execute tool: its description carries the compact
stub module), and the stubs as resources (`ptc://stubs/compact`, what the model reads;
`ptc://stubs/module`, the module the script imports). The tools a script may call come from a
manifest (`--tools`) and from upstream MCP servers (`--upstream "COMMAND ..."`, repeatable): each
upstream is started over stdio, its tools become stubs, and every stub call is forwarded to it
as a client-mode call — validated by the broker and recorded in the call log like any other.
An agent then calls many upstream tools from one script instead of one tool per turn.

Scripts run on an embedded engine (the process backend) unless `--server` names a `ptc serve`
to run them on; either way through a `ScriptRunner`.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError

from sandbox.client.tools import ToolLike
from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls
from sandbox.integrations.execute_tool import ExecuteTool
from sandbox.integrations.mcp_upstream import connect_upstream
from sandbox.integrations.runners import ScriptRunner
from sandbox.limits import Limits
from stubs_gen import render_module

__all__ = ["McpOptions", "build_mcp_server", "serve_mcp"]

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


def build_mcp_server(execute: ExecuteTool, name: str = "ptc-sandbox") -> MCPServer[Any]:
    """An `MCPServer` with `execute_python` and the stub resources of ``execute``."""
    server: MCPServer[Any] = MCPServer(
        name,
        instructions="Call many tools from one Python script with the execute tool.",
        log_level="WARNING",
    )
    module = render_module(execute.manifest)

    async def execute_python(code: str) -> str:
        observation = await execute.arun(code)
        if observation.is_error:
            raise McpToolError(observation.text)
        return observation.text

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
    async with AsyncExitStack() as stack:
        tools: list[ToolLike] = list(options.tools)
        seen = {_name(t) for t in tools}
        for command in options.upstream:
            upstream = await connect_upstream(stack, command)
            for tool in upstream.tools:
                if tool.name in seen:
                    raise InvalidArgument(
                        f"--upstream {command!r}: tool {tool.name!r} is already provided"
                    )
                seen.add(tool.name)
                tools.append(tool)
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
            await server.run_streamable_http_async(host=options.host, port=options.port)


def _name(tool: ToolLike) -> str:
    if isinstance(tool, dict):
        inner = tool.get("function") if tool.get("type") == "function" else None
        source = inner if isinstance(inner, dict) else tool
        return str(source.get("name", ""))
    return str(getattr(tool, "name", getattr(tool, "__name__", "")))
