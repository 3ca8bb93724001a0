"""``ptc audit list | show ID | verify | export | prune``: read and check the audit store.

``--db`` names the store: a SQLite file or a ``postgresql://`` URL (default: ``$PTC_AUDIT_DB``).
These are operator commands with direct access to the store, so they see every tenant unless
``--tenant`` narrows them. ``list`` and ``export`` take the same filters as ``ListExecutions``:
``--since/--until`` (ISO 8601 or Unix seconds), ``--status``, ``--tool``, ``--violation``.
``verify`` exits 1 and prints one line per problem, each naming the record, when a chain is
broken; ``prune`` applies each tenant's ``audit_retention_days`` from a tenants file.
``verify --checkpoint FILE`` also proves the store still holds everything signed checkpoints
cover, and ``verify --since-checkpoint FILE`` starts after a signed checkpoint instead of at the
first entry; ``keygen`` and ``checkpoint`` make keys and checkpoints (`_audit_checkpoints`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

from sandbox.audit import AuditQuery, SqlAuditStore, is_postgres_url, open_store
from sandbox.audit.base import AuditRecord
from sandbox.audit.export import export_jsonl, iter_records, record_to_json
from sandbox.audit.retention import apply_retention
from sandbox.commands._audit_checkpoints import (
    _checkpoint_args,
    _verify_checkpoints,
    _verify_since,
)
from sandbox.errors import InvalidArgument

__all__ = ["register"]


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not ISO 8601 or Unix seconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()


def _common(parser: argparse.ArgumentParser, filters: bool) -> None:
    parser.add_argument(
        "--db",
        default=os.environ.get("PTC_AUDIT_DB"),
        help="SQLite file or postgresql:// URL (default: $PTC_AUDIT_DB)",
    )
    parser.add_argument("--tenant", help="only this tenant (default: every tenant)")
    if filters:
        parser.add_argument("--since", type=_time, help="admitted at or after (ISO or Unix s)")
        parser.add_argument("--until", type=_time, help="admitted before (ISO or Unix s)")
        parser.add_argument("--status", help="ok, error, limit_exceeded, interrupted, running...")
        parser.add_argument("--tool", help="only records that called this tool")
        parser.add_argument("--violation", help="only records with a violation of this limit")
        parser.add_argument("--session", help="only the executions of this session")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "audit", help="list, show, verify and export audit records", description=__doc__
    )
    sub = parser.add_subparsers(dest="audit_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="list records, newest first")
    _common(listing, filters=True)
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(handler=_list)
    show = sub.add_parser("show", help="print one record as JSON")
    show.add_argument("execution_id", metavar="ID")
    _common(show, filters=False)
    show.set_defaults(handler=_show)
    verify = sub.add_parser("verify", help="check the hash chains; exit 1 when broken")
    _common(verify, filters=False)
    verify.set_defaults(handler=_verify)
    _checkpoint_args(verify, sub)
    export = sub.add_parser("export", help="write records as JSON lines")
    _common(export, filters=True)
    export.add_argument("--output", "-o", default="-", help="file to write (default: stdout)")
    export.set_defaults(handler=_export)
    prune = sub.add_parser("prune", help="delete records older than each tenant's retention")
    _common(prune, filters=False)
    prune.add_argument("--tenants", required=True, metavar="CONFIG", help="the tenants file")
    prune.set_defaults(handler=_prune)


def _open(args: argparse.Namespace) -> SqlAuditStore:
    target = args.db
    if not target:
        raise InvalidArgument("no audit store: pass --db PATH|URL or set PTC_AUDIT_DB")
    if not is_postgres_url(target) and not os.path.exists(target.removeprefix("sqlite://")):
        raise InvalidArgument(f"no audit store at {target}")
    return open_store(target)


def _tenants(store: SqlAuditStore, args: argparse.Namespace) -> list[str]:
    return [args.tenant] if args.tenant else store.tenants()


def _query(args: argparse.Namespace, limit: int = 50) -> AuditQuery:
    return AuditQuery(
        since=args.since,
        until=args.until,
        status=args.status,
        tool=args.tool,
        violation=args.violation,
        limit=limit,
        session_id=_session_id(args.session),
    )


def _session_id(value: str | None) -> str | None:
    from sandbox.codec.query import SESSION_ID

    if value is not None and not SESSION_ID.fullmatch(value):
        raise InvalidArgument(f"--session: {value[:80]!r} is not a session id")
    return value


def _list(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        shown = 0
        for tenant in _tenants(store, args):
            for record in iter_records(store, tenant, _query(args)):
                if shown >= args.limit:
                    return 0
                shown += 1
                if args.json:
                    summary = _as_json(record)
                    summary.pop("script")
                    summary.pop("manifest_json")
                    print(json.dumps(summary, ensure_ascii=False))
                    continue
                admitted = datetime.datetime.fromtimestamp(
                    record.admission.admitted_at, datetime.UTC
                ).isoformat(timespec="seconds")
                calls = len(record.result.calls) if record.result else 0
                violations = (
                    ",".join(v.limit for v in record.result.violations) if record.result else ""
                )
                why = f"  ({record.interrupted_reason})" if record.interrupted_reason else ""
                print(
                    f"{record.admission.execution_id}  {tenant}  {record.status:<14} {admitted}"
                    f"  calls={calls}  violations={violations or '-'}{why}"
                )
    finally:
        store.close()
    return 0


def _show(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        if args.tenant:
            record = store.get(args.tenant, args.execution_id)
        else:
            record = store.find(args.execution_id)
    finally:
        store.close()
    if record is None:
        print(f"ptc audit show: no record {args.execution_id}", file=sys.stderr)
        return 1
    print(json.dumps(_as_json(record), indent=2, ensure_ascii=False))
    return 0


def _as_json(record: AuditRecord) -> dict[str, Any]:
    """The record as `list --json` and `show` print it: the export's fields, and why it is
    `interrupted` when no result says so ("" otherwise), as the chain's entry wrote it."""
    return {**record_to_json(record), "interrupted_reason": record.interrupted_reason or ""}


def _verify(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        if args.since_checkpoint:
            report, checked = _verify_since(store, args)
        else:
            report = store.verify(args.tenant)
            checked = _verify_checkpoints(store, args)
    finally:
        store.close()
    for line in checked.lines:
        print(line)
    for problem in checked.problems:
        print(f"ptc audit verify: {problem}", file=sys.stderr)
    if checked.problems:
        print(f"BROKEN: {len(checked.problems)} checkpoint(s) do not hold")
    for problem in report.problems:
        print(f"ptc audit verify: {problem}", file=sys.stderr)
    if not report.ok:
        print(f"BROKEN: {len(report.problems)} problem(s) in {report.records} records")
        return 1
    if checked.problems:
        return 1
    print(f"ok: {report.records} records verified")
    return 0


def _export(args: argparse.Namespace) -> int:
    store = _open(args)
    try:
        tenants = _tenants(store, args)
        if args.output == "-":
            count = export_jsonl(store, tenants, _query(args), sys.stdout)
        else:
            with open(args.output, "w", encoding="utf-8") as out:
                count = export_jsonl(store, tenants, _query(args), out)
    finally:
        store.close()
    print(f"exported {count} records", file=sys.stderr)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from sandbox.tenants.config import load_tenants

    tenants = [
        config.tenant
        for config in load_tenants(args.tenants).tenants
        if not args.tenant or config.tenant.id == args.tenant
    ]
    store = _open(args)
    try:
        for tenant_id, pruned in apply_retention(store, tenants).items():
            print(f"{tenant_id}: pruned {pruned} records")
    finally:
        store.close()
    return 0
