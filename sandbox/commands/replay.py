"""``ptc replay EXECUTION_ID --audit-db PATH|URL``: re-run a recorded execution, tools answered
from its record, and print what differs (`sandbox.replay`).

Embedded (no server): the recorded script runs in a fresh sandbox of this host's backend, under
the recorded effective limits (``--limit`` replaces some), the recorded manifest (``--tools``
replaces it) and today's stub generator and runtime; the replay is recorded in the same store.
``--server HOST:PORT`` asks a `ptc serve` instead (the `Replay` RPC, the caller's tenant only).

Exit codes: 0 identical, 1 differs; an error is printed as ``ptc replay: [kind: ]message`` with
the codes of `sandbox.errors` (2 invalid argument, 8 not found: no such execution, or another
tenant's, 14 failed precondition: the record cannot be replayed, e.g. it predates replay).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from sandbox.backends.factory import command_backend
from sandbox.commands._client_tls import add_tls_options, given, tls_options
from sandbox.commands._manifest_file import read_manifest
from sandbox.engine import Engine, EngineConfig
from sandbox.errors import InvalidArgument, PtcError
from sandbox.limits import Limits, parse_limit_args
from sandbox.replay_report import ReplayReport

__all__ = ["register"]

IDENTICAL, DIFFERS = 0, 1


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="re-run a recorded execution with tool calls answered from its record",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("execution_id", metavar="EXECUTION_ID")
    parser.add_argument(
        "--audit-db",
        metavar="PATH|URL",
        default=os.environ.get("PTC_AUDIT_DB"),
        help="the audit store holding the record (default $PTC_AUDIT_DB)",
    )
    parser.add_argument("--tenant", help="the record's tenant (default: whichever holds the id)")
    parser.add_argument("--tools", metavar="MANIFEST", help="replay against this manifest")
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="replace a recorded limit: times in seconds, sizes in bytes (repeatable)",
    )
    parser.add_argument(
        "--backend", choices=["process", "docker"], help="default: the recorded backend"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON report object")
    parser.add_argument(
        "--allow-degraded",
        action="store_true",
        help="run without cgroup limits or the seccomp filter when the host cannot provide them",
    )
    parser.add_argument("--server", metavar="ADDR", help="replay on a `ptc serve` at ADDR")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PTC_API_KEY"),
        help="API key for --server (default $PTC_API_KEY)",
    )
    add_tls_options(parser)
    parser.set_defaults(handler=run)


async def _embedded(args: argparse.Namespace, manifest: str | None, limits: Limits) -> ReplayReport:
    from sandbox.audit import open_store
    from sandbox.replay.run import find_record, replay

    store = open_store(args.audit_db, instance="ptc-replay")
    try:
        store.mark_interrupted()  # replays this command left running when it was killed
        record = find_record(store, args.execution_id, args.tenant)
        backend = args.backend or record.admission.backend
        backends = command_backend(backend, args.allow_degraded)
        async with Engine(EngineConfig(backends=backends, default_backend=backend)) as engine:
            return await replay(
                engine,
                store,
                args.execution_id,
                tenant=record.admission.tenant,
                manifest=manifest,
                limits=limits,
                backend=backend,
            )
    finally:
        store.close()


def _remote(args: argparse.Namespace, manifest: str | None, limits: Limits) -> ReplayReport:
    from sandbox.client import Client

    try:
        with Client(args.server, args.api_key, **tls_options(args)) as client:
            return client.replay(
                args.execution_id, tools=manifest, limits=limits, backend=args.backend
            )
    except PtcError as exc:
        exc.message = f"server {args.server}: {exc.message}"
        raise


def run(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.tools) if args.tools else None
    limits = parse_limit_args(args.limit)
    if args.server:
        report = _remote(args, manifest, limits)
    else:
        for flag in given(args):
            raise InvalidArgument(f"{flag}: TLS is for a server; give --server ADDR too")
        if not args.audit_db:
            raise InvalidArgument("--audit-db: is required without --server (or set PTC_AUDIT_DB)")
        report = asyncio.run(_embedded(args, manifest, limits))
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        print_report(report)
    return IDENTICAL if report.identical else DIFFERS


def print_report(report: ReplayReport) -> None:
    result = report.result
    out = sys.stdout
    verdict = "identical" if report.identical else f"{len(report.differences)} differences"
    print(
        f"replay of {report.execution_id} (recorded as {result.execution_id}): {verdict}", file=out
    )
    print(f"── status: {result.status}  exit code: {result.exit_code}", file=out)
    for difference in report.differences:
        print(f"  {difference.what:<12} {difference.kind:<10} {difference.detail}", file=out)
