"""`ptc run SCRIPT --tools MANIFEST [--json] [--limit NAME=VALUE ...]`: one embedded execution.

No server is needed: the engine starts the process backend (a pool of one), runs the script and
stops. With `--json` exactly one JSON object is printed on stdout (DESIGN.md's contract); without
it, the script's output followed by a table of calls and violations. The exit code reflects the
status: 0 ok, 1 error, 3 limit_exceeded, 4 rejected, 5 cancelled, 2 a bad request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult, ExecutionStatus

EXIT_CODES = {
    ExecutionStatus.OK: 0,
    ExecutionStatus.ERROR: 1,
    ExecutionStatus.LIMIT_EXCEEDED: 3,
    ExecutionStatus.REJECTED: 4,
    ExecutionStatus.CANCELLED: 5,
    ExecutionStatus.INTERRUPTED: 6,
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
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--policy", choices=["none", "restricted"], default="none")
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
        default=os.environ.get("PTC_AUDIT_DB"),
        help="record the execution in this audit store (SQLite file or postgresql:// URL; "
        "default $PTC_AUDIT_DB, else not recorded)",
    )
    parser.add_argument(
        "--allow-degraded",
        action="store_true",
        help="run without cgroup limits or the seccomp filter when the host cannot provide them",
    )
    parser.add_argument(
        "--server", metavar="ADDR", help="run on a `ptc serve` server at ADDR (host:port)"
    )
    parser.set_defaults(handler=run)


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{what} {path}: {exc}") from exc


def parse_expect(items: list[str]) -> tuple[ExpectedCalls, ...]:
    out = []
    for item in items:
        tool, sep, counts = item.rpartition("=")
        low, _, high = counts.partition(":")
        try:
            if not sep or not tool:
                raise ValueError
            out.append(ExpectedCalls(tool, int(low) if low else None, int(high) if high else None))
        except ValueError:
            raise InvalidArgument(f"--expect {item!r}: expected TOOL=MIN[:MAX]") from None
    return tuple(out)


async def _execute(
    request: ExecutionRequest, allow_degraded: bool, audit_db: str | None = None
) -> ExecutionResult:
    backends: dict[str, Any] = {}
    if request.backend == "docker":
        from sandbox.backends.docker.backend import DockerBackend

        backends["docker"] = DockerBackend()
    else:
        from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig

        backends["process"] = ProcessBackend(
            ProcessBackendConfig(pool_size=1, allow_degraded=allow_degraded)
        )
    async with Engine(
        EngineConfig(backends=backends, default_backend=request.backend or "process")
    ) as engine:
        if audit_db is None:
            return await engine.execute(request)
        return await _execute_audited(engine, request, audit_db)


async def _execute_audited(
    engine: Engine, request: ExecutionRequest, audit_db: str
) -> ExecutionResult:
    """One execution recorded like the server records it: admitted first, then completed."""
    import time
    import uuid

    from sandbox.audit import open_store
    from sandbox.audit.base import Admission

    store = open_store(audit_db, instance="ptc-run")
    try:
        store.mark_interrupted()
        manifest = engine.manifest(request)
        limits = engine.effective_limits(request.limits)
        execution_id = uuid.uuid4().hex
        store.admit(
            Admission(
                execution_id=execution_id,
                tenant="default",
                script=request.script,
                manifest_json=request.manifest if isinstance(request.manifest, str) else "[]",
                manifest_sha256=manifest.sha256,
                backend=request.backend or "process",
                policy=request.policy,
                effective_limits=limits[0].to_json(),
                admitted_at=time.time(),
            )
        )
        result = await engine.execute(request, limits=limits, execution_id=execution_id)
        store.complete(execution_id, result)
        return result
    finally:
        store.close()


def _execute_remote(server: str, request: ExecutionRequest, manifest: str) -> ExecutionResult:
    import grpc

    from sandbox.client import Client

    with Client(server) as client:
        try:
            return client.run(
                request.script,
                manifest,
                limits=request.limits,
                backend=request.backend,
                policy=request.policy,
                expected_calls=request.expected_calls,
            )
        except grpc.RpcError as exc:  # the RPC failed: name the server and the status
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise InvalidArgument(f"server {server}: {code.name}: {details}") from exc


def run(args: argparse.Namespace) -> int:
    script = _read(args.script, "script")
    manifest = _read(args.tools, "manifest") if args.tools else "[]"
    request = ExecutionRequest(
        script=script,
        manifest=manifest,
        limits=parse_limit_args(args.limit),
        backend=args.backend,
        policy=args.policy,
        expected_calls=parse_expect(args.expect),
    )
    if args.server:
        result = _execute_remote(args.server, request, manifest)
    else:
        result = asyncio.run(_execute(request, args.allow_degraded, args.audit_db))
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        print_summary(result)
    return EXIT_CODES[result.status]


def print_summary(result: ExecutionResult) -> None:
    sys.stdout.write(result.stdout)
    if result.stderr:
        sys.stderr.write(result.stderr)
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
    if result.error:
        print(
            f"── error: {result.error.type}: {result.error.message} (line {result.error.line})",
            file=err,
        )
