"""`ptc run SCRIPT --tools MANIFEST [--json] [--limit NAME=VALUE ...]`: one execution.

No server is needed: the engine starts the process backend (a pool of one), runs the script and
stops; `--server HOST:PORT` runs it on a `ptc serve` instead, through the client SDK. With
`--json` exactly one JSON object is printed on stdout (DESIGN.md's contract); without it, the
script's stdout and stderr are written as they arrive, then a summary of calls and violations on
stderr. `--audit-db` records the execution through the same `Recorder` as the server.
`--file PATH[=NAME]` gives the script an input file; `--outputs-dir DIR` saves what it wrote
under outputs/.

Exit codes, the same embedded and with `--server`. A finished execution: 0 ok, 1 error,
3 limit_exceeded, 4 rejected, 5 cancelled, 6 interrupted, 7 failed. A request or service error
(`sandbox.errors`, printed as ``ptc run: [kind: ]message``): 2 invalid argument, 8 not found,
9 unauthenticated, 10 permission denied, 11 resource exhausted, 12 unavailable, 13 internal.
A reader that went away (``| head``): 141, quietly, the execution cancelled. Ctrl-C on an
embedded run cancels it: its result (status cancelled, the output so far) is printed, exit 5;
Ctrl-C again quits at once (130). With `--server`, Ctrl-C closes the stream, which cancels the
execution there, says so and exits 130.

Every option applies where the script runs or is refused naming it, never ignored: with
`--server`, the embedded-only `--audit-db` and `--allow-degraded` are refused; `--api-key` needs
`--server`; on a session cell (`--session`) the options apply as on a single-use run, except a
backend or runtime other than the session's (refused by the server, naming the session's) and
the session's whole-sandbox limits (`memory`, `processes`, `file_size`, `open_files`: set by
`ptc session create --limit`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandbox.backends.base import Backend
from sandbox.backends.factory import command_backend
from sandbox.capture import OutputCallback
from sandbox.commands._client_tls import add_tls_options, given, tls_options
from sandbox.commands._expect import parse_expect
from sandbox.commands._manifest_file import read_manifest
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, PreparedExecution, RunHooks
from sandbox.errors import InvalidArgument, PtcError
from sandbox.files import InputFile
from sandbox.integrations.runners import execution_request
from sandbox.limits import parse_limit_args
from sandbox.options import RunOptions
from sandbox.recording import Recorder
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.telemetry.live import StatusLine

EXIT_CODES = {
    ExecutionStatus.OK: 0,
    ExecutionStatus.ERROR: 1,
    ExecutionStatus.LIMIT_EXCEEDED: 3,
    ExecutionStatus.REJECTED: 4,
    ExecutionStatus.CANCELLED: 5,
    ExecutionStatus.INTERRUPTED: 6,
    ExecutionStatus.FAILED: 7,
}


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("run", help="run one script in a sandbox (no server needed)")
    parser.add_argument("script", help="the script file, or - for standard input")
    parser.add_argument("--tools", metavar="MANIFEST", help="tool manifest (JSON file)")
    parser.add_argument("--json", action="store_true", help="print one JSON result object")
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a limit: times in seconds, sizes in bytes (repeatable)",
    )
    # None when not given: a session keeps its own backend, a server its tenant's policy.
    parser.add_argument(
        "--backend",
        choices=["process", "docker", "gvisor"],
        help="where the sandbox runs (default: process; a session cell: the session's)",
    )
    parser.add_argument(
        "--policy",
        choices=["none", "restricted"],
        help="script policy (default: none; with --server: the tenant's)",
    )
    parser.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="TOOL=MIN[:MAX]",
        help="expected number of calls of a tool (repeatable)",
    )
    parser.add_argument(
        "--audit-db",
        metavar="PATH|URL",
        help="record the execution in this audit store (SQLite file or postgresql:// URL; "
        "default $PTC_AUDIT_DB, else not recorded; not with --server, which records it)",
    )
    parser.add_argument(
        "--allow-degraded",
        action="store_true",
        help="run without cgroup limits or the seccomp filter when the host cannot provide "
        "them (not with --server: the server decides)",
    )
    parser.add_argument(
        "--server", metavar="ADDR", help="run on a `ptc serve` server at ADDR (host:port)"
    )
    parser.add_argument(
        "--api-key",
        help="API key for --server (default $PTC_API_KEY)",
    )
    add_tls_options(parser)
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH[=NAME]",
        help="an input file the script finds in its working directory, read-only, as NAME "
        "(default: the file's base name; repeatable)",
    )
    parser.add_argument(
        "--outputs-dir",
        metavar="DIR",
        help="save the files the script wrote under outputs/ into DIR (the JSON result then "
        "lists them without their bytes)",
    )
    parser.add_argument(
        "--runtime",
        metavar="NAME",
        help="run in this runtime (`ptc runtime list`; runtimes are found in $PTC_RUNTIMES_DIR); "
        "default: the standard library only",
    )
    _add_session_argument(parser)
    parser.set_defaults(handler=run)


def _add_session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--session",
        metavar="ID",
        help="run as the next cell of this session (`ptc session create`; needs --server)",
    )


def parse_files(items: list[str]) -> tuple[InputFile, ...]:
    """``--file PATH[=NAME]``: a PATH that exists is taken whole; otherwise the text after the
    last ``=`` is the name."""
    out: list[InputFile] = []
    for item in items:
        path, name = item, os.path.basename(item)
        if not os.path.exists(item) and "=" in item:
            path, _, name = item.rpartition("=")
        try:
            out.append(InputFile(name, Path(path).read_bytes()))
        except OSError as exc:
            raise InvalidArgument(f"--file {item!r}: {exc.strerror or exc}") from exc
    return tuple(out)


def save_outputs(result: ExecutionResult, directory: str) -> None:
    """Writes the returned output files under ``directory``."""
    try:
        for output in result.output_files:
            output.save(directory)
    except OSError as exc:
        raise InvalidArgument(f"--outputs-dir {directory}: {exc}") from exc


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{what} {path}: {exc}") from exc


async def _execute(
    request: ExecutionRequest,
    backends: dict[str, Backend],
    audit_db: str | None = None,
    on_output: OutputCallback | None = None,
    status: StatusLine | None = None,
) -> ExecutionResult:
    cancel = asyncio.Event()
    if isinstance(on_output, _Live):
        on_output.cancel = cancel
    with _ctrl_c_cancels(cancel, status):
        return await _execute_in_engine(request, backends, audit_db, on_output, status, cancel)


@contextlib.contextmanager
def _ctrl_c_cancels(cancel: asyncio.Event, status: StatusLine | None) -> Iterator[None]:
    """A Ctrl-C cancels the run, which then ends as `cancelled` with the output it wrote so far
    (printed, exit 5), so that the user keeps what the script printed. A second Ctrl-C quits at
    once (Python's own KeyboardInterrupt: exit 130)."""
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        loop.remove_signal_handler(signal.SIGINT)  # the next one is Python's again
        cancel.set()
        if status is not None:
            status.clear()
        with contextlib.suppress(OSError):
            print(
                "\nptc run: Ctrl-C: cancelling the execution (Ctrl-C again to quit at once)",
                file=sys.stderr,
                flush=True,
            )

    try:
        loop.add_signal_handler(signal.SIGINT, interrupted)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: as before
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)


@contextlib.contextmanager
def _ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt while the served run lasts, as the embedded run's loop
    takes it (`_ctrl_c_cancels`), even where this command started with SIGINT ignored (a
    background job of a shell without job control inherits that across exec, and Python then
    leaves it ignored): a `ptc run --server` that ignored Ctrl-C would leave its execution
    running on the server."""
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: the caller's own handling stands
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def _execute_in_engine(
    request: ExecutionRequest,
    backends: dict[str, Backend],
    audit_db: str | None,
    on_output: OutputCallback | None,
    status: StatusLine | None,
    cancel: asyncio.Event,
) -> ExecutionResult:
    async with Engine(
        EngineConfig(backends=backends, default_backend=request.backend or "process")
    ) as engine:
        prepared = engine.prepare(request)
        if status is not None:
            with status.running():
                return await _execute_prepared(
                    engine, prepared, audit_db, on_output, status, cancel
                )
        return await _execute_prepared(engine, prepared, audit_db, on_output, None, cancel)


async def _execute_prepared(
    engine: Engine,
    prepared: PreparedExecution,
    audit_db: str | None,
    on_output: OutputCallback | None,
    status: StatusLine | None,
    cancel: asyncio.Event,
) -> ExecutionResult:
    on_started = status.started if status is not None else None
    hooks = RunHooks(on_output=on_output, on_started=on_started, cancel=cancel)
    if audit_db is None:
        return await engine.run(prepared, hooks=hooks)
    from sandbox.audit import open_store

    # Recorded like the server records: admitted first, then completed or failed.
    store = open_store(audit_db, instance="ptc-run")
    try:
        store.mark_interrupted()
        return await Recorder(store).run(engine, prepared, hooks=hooks)
    finally:
        store.close()


def _execute_remote(
    args: argparse.Namespace,
    script: str,
    manifest: str | None,
    options: RunOptions,
    on_output: OutputCallback | None = None,
    status: StatusLine | None = None,
) -> ExecutionResult:
    from sandbox.client import Client, OutputChunk
    from sandbox.telemetry.spans import step_span

    def forward(chunk: OutputChunk) -> None:
        if on_output is not None:
            on_output(chunk.stream, chunk.data)

    server = args.server
    try:
        # When this process traces, its span is the parent of the server's (sent by the client).
        with (
            _ctrl_c_raises(),
            Client(server, args.api_key, **tls_options(args)) as client,
            step_span("ptc.run", **{"ptc.server": server}),
        ):
            return client.run(
                script,
                manifest,
                options,
                on_output=forward,
                on_progress=status.update if status is not None else None,
            )
    except PtcError as exc:  # the same class, naming the server it came from
        exc.message = f"server {server}: {exc.message}"
        raise
    except KeyboardInterrupt:
        # The stream closes with the client, which cancels the execution on the server.
        if status is not None:
            status.clear()
        with contextlib.suppress(OSError):
            print(
                f"\nptc run: Ctrl-C: the execution is cancelled on {server} (its record says"
                " cancelled: ptc audit, or the SDK's list_executions)",
                file=sys.stderr,
                flush=True,
            )
        raise


class _Live:
    """Writes the script's output to this process's stdout and stderr as it arrives.

    When the reader goes away (``ptc run ... | head``), the execution has nobody left to show
    its output to: embedded, ``cancel`` ends it (the engine stops and disposes of its sandbox)
    and the command ends quietly once it has; with a server, the `BrokenPipeError` leaves the
    client's stream, which cancels the execution on the server."""

    def __init__(self, status: StatusLine | None = None) -> None:
        self.written = {"stdout": 0, "stderr": 0}
        self.status = status
        self.cancel: asyncio.Event | None = None  # set by the embedded run, on its loop
        self.broken = False

    def __call__(self, stream: str, data: bytes) -> None:
        if self.broken:
            return
        target = sys.stdout if stream == "stdout" else sys.stderr
        try:
            if self.status is not None:
                self.status.clear()
            target.flush()
            target.buffer.write(data)
            target.buffer.flush()
        except BrokenPipeError:
            self.broken = True
            if self.cancel is None:
                raise
            # Called from the engine's output pipe, where an exception would only break the
            # pipe's transport: ask the engine to end the run instead.
            self.cancel.set()
            return
        self.written[stream] += len(data)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    script = _read(args.script, "script")
    manifest = read_manifest(args.tools) if args.tools else "[]"
    # None where not given: a session keeps its own backend, a server its tenant's policy.
    options = RunOptions(
        limits=parse_limit_args(args.limit),
        backend=args.backend,
        policy=args.policy,
        expected_calls=parse_expect(args.expect),
        files=parse_files(args.file),
        runtime=args.runtime,
        session_id=args.session or "",
    )
    # On a terminal, a status line for long runs (elapsed, tool calls, usage) on stderr.
    status = None if args.json or not sys.stderr.isatty() else StatusLine(sys.stderr)
    live = None if args.json else _Live(status)
    try:
        if args.server:  # a session's cell too: streamed, its output shown as it arrives
            tools = manifest if args.tools or not args.session else None  # None: the session's
            result = _execute_remote(args, script, tools, options, live, status)
        else:
            request = execution_request(script, manifest, options)
            backends = command_backend(request.backend or "process", args.allow_degraded)
            audit_db = args.audit_db or os.environ.get("PTC_AUDIT_DB") or None
            result = asyncio.run(_execute(request, backends, audit_db, live, status))
    finally:
        from sandbox.telemetry import tracing

        tracing.shutdown()  # exports the spans still batched, when this process traced
    if live is not None and live.broken:
        raise BrokenPipeError  # the reader went away: `sandbox.cli` ends quietly
    if args.outputs_dir:
        save_outputs(result, args.outputs_dir)
    if args.json:
        print(json.dumps(result.to_json(content=not args.outputs_dir), ensure_ascii=False))
    else:
        print_summary(result, live.written if live is not None else None)
    return EXIT_CODES[result.status]


# `ptc run` options that only the embedded engine can honour: with --server, the server decides.
_EMBEDDED_ONLY = {
    "audit_db": "--audit-db: the server records its executions in its own audit store",
    "allow_degraded": "--allow-degraded: the server decides its isolation "
    "(`ptc serve --allow-degraded`)",
}


def check_options(args: argparse.Namespace) -> None:
    """Refuses the options that would not apply where the script runs, naming each one: every
    option either applies or is refused, never ignored. (A session cell's backend and runtime
    are checked against the session by the server, which knows them.)"""
    if args.session and not args.server:
        raise InvalidArgument("--session: sessions live on a server; give --server ADDR too")
    if args.api_key and not args.server:
        raise InvalidArgument("--api-key: keys are for a server; give --server ADDR too")
    for flag in given(args):
        if not args.server:
            raise InvalidArgument(f"{flag}: TLS is for a server; give --server ADDR too")
    if args.server:
        args.api_key = args.api_key or os.environ.get("PTC_API_KEY")
        for name, why in _EMBEDDED_ONLY.items():
            if getattr(args, name):
                raise InvalidArgument(f"{why}; not with --server")
    if args.session:
        from sandbox.commands.session import check_cell_limits

        check_cell_limits(args.limit)


def print_summary(result: ExecutionResult, streamed: dict[str, int] | None = None) -> None:
    """The script's output (what was not already streamed: all of it, or only the marker of
    what a cap dropped), then the status line, the calls, the violations and the error."""
    for name, captured in (("stdout", result.stdout), ("stderr", result.stderr)):
        already = streamed is not None and streamed[name] > 0
        target = sys.stdout if name == "stdout" else sys.stderr
        target.write(_marker(captured, name) if already else captured)
        target.flush()
    err = sys.stderr
    print(
        f"\n── status: {result.status}  exit code: {result.exit_code}  "
        f"wall {result.usage.wall_time_s:.3f}s  cpu {result.usage.cpu_time_s:.3f}s",
        file=err,
    )
    if result.calls:
        print(f"── {len(result.calls)} tool calls", file=err)
        for call in result.calls:
            args = json.dumps(call.arguments, ensure_ascii=False)
            if len(args) > 60:
                args = args[:57] + "..."
            detail = call.error or ""
            print(f"  {call.seq:>4}  {call.tool:<24} {call.status!s:<18} {args} {detail}", file=err)
    for v in result.violations:
        observed = "nothing measured" if v.observed is None else f"observed {v.observed:g}"
        print(
            f"── violation: {v.limit} = {v.limit_value:g} {v.unit}, {observed}, "
            f"{v.action} ({v.evidence} evidence). {v.detail}",
            file=err,
        )
    for output in result.output_files:
        print(
            f"── output file: {output.name} ({output.size} bytes, sha256 {output.sha256})", file=err
        )
    for omitted in result.omitted_outputs:
        size = "size unknown" if omitted.size is None else f"{omitted.size} bytes"
        print(
            f"── output omitted: {omitted.name} ({size}): {omitted.reason} {omitted.detail}",
            file=err,
        )
    if result.error:
        print(
            f"── error: {result.error.type}: {result.error.message}{result.error.where()}",
            file=err,
        )


def _marker(text: str, stream: str) -> str:
    """The truncation marker at the end of a captured stream's text, if any."""
    at = text.rfind(f"\n[ptc: {stream} truncated: ")
    return text[at:] if at >= 0 else ""
