"""Audit store benchmark (not a test): overhead per execution and `verify` throughput.

    .venv/bin/python -m bench.audit [--rounds 2000] [--records 100000] [--postgres URL]

Prints, for SQLite (a temporary file) and, when a URL is given (default
``$PTC_TEST_POSTGRES_URL``), PostgreSQL: the p50/p95 of admit + complete for one execution with
five tool calls (``--rounds`` samples, the two stores interleaved sample by sample, after a
warm-up; `bench.harness`), then the time `verify` takes over ``--records`` records and records/s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import time
import uuid

from bench.harness import Report, bench_parser, interleave_sync
from sandbox.audit import Admission, SqlAuditStore, open_store
from sandbox.limits import DEFAULTS
from sandbox.result import CallRecord, CallStatus, ExecutionResult, ExecutionStatus


def _admission(tenant: str) -> Admission:
    return Admission(
        execution_id=uuid.uuid4().hex,
        tenant=tenant,
        script="import tools\nfor i in range(5):\n    print(tools.search(q=str(i)))\n",
        manifest_json='[{"name": "search"}]',
        manifest_sha256="ab" * 32,
        backend="process",
        policy="none",
        effective_limits=DEFAULTS,
    )


def _result(execution_id: str) -> ExecutionResult:
    calls = [
        CallRecord(i, "search", {"q": str(i)}, CallStatus.OK, result={"hits": [i]})
        for i in range(1, 6)
    ]
    return ExecutionResult(execution_id, ExecutionStatus.OK, stdout="ok\n" * 5, calls=calls)


def _admit_complete(store: SqlAuditStore) -> None:
    adm = _admission("bench")
    store.admit(adm)
    store.complete(adm.execution_id, _result(adm.execution_id))


def _verify(report: Report, name: str, store: SqlAuditStore, records: int) -> None:
    for _ in range(records):
        adm = _admission("bulk")
        store.admit(adm)
        store.complete(adm.execution_id, _result(adm.execution_id))
    start = time.perf_counter()
    verified = store.verify("bulk")
    elapsed = time.perf_counter() - start
    assert verified.ok and verified.records == records, verified.problems[:3]
    report.figure(f"{name}: verify {records} records", elapsed, "s")
    report.figure(f"{name}: verify rate", records / elapsed, "records/s", fmt=",.0f")


def _run(
    report: Report, stores: dict[str, SqlAuditStore], rounds: int, warmup: int, records: int
) -> None:
    report.section("admit + complete, one execution with five tool calls")
    times = interleave_sync(
        {name: functools.partial(_admit_complete, store) for name, store in stores.items()},
        rounds,
        warmup=warmup,
    )
    for name, values in times.items():
        report.timings(name, values)
    report.section("verify")
    for name, store in stores.items():
        _verify(report, name, store, records)


def main(report: Report, rounds: int, warmup: int, records: int, postgres: str | None) -> int:
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        stores: dict[str, SqlAuditStore] = {
            "sqlite": open_store(os.path.join(tmp, "audit.sqlite3"))
        }
        stack.callback(stores["sqlite"].close)
        if postgres:
            import psycopg

            schema = f"ptc_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(postgres, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")

            def drop() -> None:
                with psycopg.connect(postgres, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")

            stack.callback(drop)
            sep = "&" if "?" in postgres else "?"
            stores["postgres"] = open_store(f"{postgres}{sep}options=-csearch_path%3D{schema}")
            stack.callback(stores["postgres"].close)
        else:
            print(
                "postgres: skipped (no --postgres URL and PTC_TEST_POSTGRES_URL unset)",
                file=sys.stderr,
            )
        _run(report, stores, rounds, warmup, records)
    return 0


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=2000, warmup=50)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--postgres", default=os.environ.get("PTC_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    with Report("audit", args) as report:
        status = main(report, args.rounds, args.warmup, args.records, args.postgres)
    raise SystemExit(status)
