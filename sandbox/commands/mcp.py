"""`ptc mcp [--transport stdio|streamable-http] [--tools MANIFEST] [--upstream [NAME=]"CMD ..."]`.

Serves the execute tool over MCP (see `sandbox.integrations.mcp_server`). With stdio, standard
output is the protocol channel: nothing else is ever printed there. Scripts run on an embedded
engine unless `--server HOST:PORT` names a `ptc serve` to run them on (over TLS with `--tls-ca`,
mTLS with `--tls-cert`/`--tls-key`); embedded, `--audit-db`
records each execution as the server would (`sandbox.recording.Recorder`). Needs the `mcp` extra.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from sandbox.commands._client_tls import add_tls_options, given, tls_options
from sandbox.commands._expect import parse_expect
from sandbox.commands._manifest_file import read_manifest
from sandbox.errors import InvalidArgument
from sandbox.limits import parse_limit_args

if TYPE_CHECKING:
    from sandbox.integrations.mcp_server import McpOptions
    from sandbox.integrations.runners import ClientRunner, EmbeddedRunner, ScriptRunner

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("mcp", help="serve the execute tool over MCP")
    parser.add_argument(
        "--transport", choices=["stdio", "streamable-http"], default="stdio", help="MCP transport"
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address (streamable-http)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (streamable-http)")
    parser.add_argument(
        "--tenants",
        metavar="TOML",
        help="tenants file (as for ptc serve): HTTP callers must send 'Authorization: Bearer KEY' "
        "with one of its API keys; required to listen on a non-loopback --host",
    )
    parser.add_argument("--tools", metavar="MANIFEST", help="tool manifest (JSON file)")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar='[NAME=]"COMMAND ..."',
        help="an upstream MCP server to start over stdio; its tools become stubs (repeatable); "
        "a NAME offers its tools as NAME__TOOL, so two servers may offer the same tool names",
    )
    parser.add_argument(
        "--limit", action="append", default=[], metavar="NAME=VALUE", help="a limit (repeatable)"
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="TOOL=MIN[:MAX]",
        help="expected number of calls of a tool in every script (repeatable)",
    )
    parser.add_argument("--name", default="execute_python", help="the execute tool's name")
    parser.add_argument(
        "--server", metavar="ADDR", help="run scripts on a `ptc serve` server at ADDR"
    )
    parser.add_argument("--api-key", help="API key for --server")
    add_tls_options(parser)
    parser.add_argument(
        "--audit-db",
        metavar="PATH|URL",
        default=None,
        help="record every execution in this audit store (SQLite file or postgresql:// URL; "
        "embedded only: with --server the server records them)",
    )
    parser.add_argument(
        "--allow-degraded",
        action="store_true",
        help="run without cgroup limits or the seccomp filter when the host cannot provide them",
    )
    parser.add_argument(
        "--session",
        action="store_true",
        help="keep state across execute calls: every call runs in one session that lives as "
        "long as this server (stdio only: one conversation per process)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        import anyio

        from sandbox.integrations.mcp_server import serve_mcp
    except ImportError as exc:  # the `mcp` extra is missing
        raise InvalidArgument(f"ptc mcp needs the `mcp` extra: {exc}") from exc

    options = _options(args)
    runner = _runner(args)
    # SIGTERM stops like Ctrl-C: the sandboxes, cgroups and runtime files go with the runner.
    # (uvicorn handles it for the HTTP transport, then raises it again: it lands here too.)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    served: ScriptRunner = runner
    try:
        if args.session:
            from sandbox.integrations.session_runners import open_session

            served = open_session(runner)
        anyio.run(serve_mcp, served, options)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if served is not runner:
            served.close()
        runner.close()
        sys.stderr.flush()
    return 0


def _options(args: argparse.Namespace) -> McpOptions:
    """The MCP server's options from the arguments, checked before anything starts: an
    unauthenticated public listener, a bad upstream name and --session over HTTP are refused."""
    from sandbox.integrations.mcp_server import (
        McpOptions,
        check_exposure,
        load_tools_file,
        parse_upstreams,
    )

    tools: list[Any] = []
    if args.tools:
        tools = load_tools_file(read_manifest(args.tools))
    options = McpOptions(
        transport=args.transport,
        host=args.host,
        port=args.port,
        tools=tools,
        upstream=list(args.upstream),
        limits=parse_limit_args(args.limit),
        expected_calls=parse_expect(args.expect),
        tool_name=args.name,
        tenants=args.tenants,
    )
    check_exposure(options)
    parse_upstreams(options.upstream)
    if args.session and args.transport != "stdio":
        raise InvalidArgument(
            "--session: only with --transport stdio (over HTTP many conversations would share "
            "one session's state)"
        )
    return options


def _runner(args: argparse.Namespace) -> ClientRunner | EmbeddedRunner:
    """Where scripts run: the `ptc serve` that --server names (TLS options only with it), or
    an embedded engine on the process backend (recording to --audit-db when given)."""
    from sandbox.integrations.runners import ClientRunner, EmbeddedRunner

    if args.server and args.audit_db:
        raise InvalidArgument("--audit-db: with --server the server keeps the audit records")
    for flag in given(args):
        if not args.server:
            raise InvalidArgument(f"{flag}: TLS is for a server; give --server ADDR too")
    if args.server:
        return ClientRunner.connect(args.server, args.api_key, **tls_options(args))
    from sandbox.backends.factory import command_backend
    from sandbox.engine import EngineConfig

    backends = command_backend("process", args.allow_degraded)
    return EmbeddedRunner(EngineConfig(backends=backends), audit=args.audit_db)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
