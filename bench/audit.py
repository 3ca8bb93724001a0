"""Audit store benchmark (not a test): overhead per execution and `verify` throughput.

    .venv/bin/python -m bench.audit [--records 100000] [--postgres URL]

Prints, for SQLite (a temporary file) and, when a URL is given (default
``$PTC_TEST_POSTGRES_URL``), PostgreSQL: the p50/p95 of admit + complete for one execution with
five tool calls, then the time `verify` takes over ``--records`` records and records/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

from sandbox.audit import Admission, SqlAuditStore, open_store
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
        effective_limits={"wall_time": 10.0, "memory": 268435456.0},
    )


def _result(execution_id: str) -> ExecutionResult:
    calls = [
        CallRecord(i, "search", {"q": str(i)}, CallStatus.OK, result={"hits": [i]})
        for i in range(1, 6)
    ]
    return ExecutionResult(execution_id, ExecutionStatus.OK, stdout="ok\n" * 5, calls=calls)


def _overhead(store: SqlAuditStore, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        adm = _admission("bench")
        start = time.perf_counter()
        store.admit(adm)
        store.complete(adm.execution_id, _result(adm.execution_id))
        samples.append(time.perf_counter() - start)
    return samples


def _verify(store: SqlAuditStore, records: int) -> None:
    for _ in range(records):
        adm = _admission("bulk")
        store.admit(adm)
        store.complete(adm.execution_id, _result(adm.execution_id))
    start = time.perf_counter()
    report = store.verify("bulk")
    elapsed = time.perf_counter() - start
    assert report.ok and report.records == records, report.problems[:3]
    print(f"  verify: {records} records in {elapsed:.2f} s = {records / elapsed:,.0f} records/s")


def _run(name: str, store: SqlAuditStore, records: int) -> None:
    samples = _overhead(store, 2000)
    p50, p95 = statistics.median(samples) * 1e3, statistics.quantiles(samples, n=20)[18] * 1e3
    print(f"{name}: admit+complete p50 {p50:.3f} ms, p95 {p95:.3f} ms")
    _verify(store, records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--postgres", default=os.environ.get("PTC_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(os.path.join(tmp, "audit.sqlite3"))
        try:
            _run("sqlite", store, args.records)
        finally:
            store.close()
    if args.postgres:
        import psycopg

        schema = f"ptc_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in args.postgres else "?"
        store = open_store(f"{args.postgres}{sep}options=-csearch_path%3D{schema}")
        try:
            _run("postgres", store, args.records)
        finally:
            store.close()
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    else:
        print(
            "postgres: skipped (no --postgres URL and PTC_TEST_POSTGRES_URL unset)", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
