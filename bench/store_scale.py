"""The audit store at 10 thousand, 100 thousand and a million executions: is every request flat?

    .venv/bin/python -m bench.store_scale [--sizes 2000,20000] [--engines sqlite,postgres]
        [--rounds 15] [--api-up-to 100000] [--pg-url URL]

One store per engine (a SQLite file in a temporary directory; a fresh schema of the PostgreSQL
server ``--pg-url`` or ``$PTC_TEST_POSTGRES_URL`` names, dropped afterwards) is filled with one
big tenant's executions up to each size in turn, plus a small second tenant, and at each size
the same calls are timed (``--rounds`` each, p50 and p95):

- ``admission``, ``completion``: `admit` and `complete` of a new execution;
- ``get by id``: `get` of an execution from the middle of the history;
- ``holder of a session``: `holder` (which server holds a session);
- ``idempotency look-up``: `by_key` of a key from the middle of the history;
- ``list: ...``: a page of 50 with no filter, by status, by a tool most executions call, by a
  tool few call, by violation, by session; and a page of the small tenant;
- ``a session's cells``: every page of a 20-cell session's executions, as a rebuild reads them;
- ``checkpoint, 1000 new``: `CheckpointPublisher.publish_once` after 1,000 new executions
  (``--new``);
- ``verify since checkpoint``: `verify` from that checkpoint's frontier after 1,000 more (what
  ``ptc audit verify --since-checkpoint`` does after checking the checkpoint's signature).

Executions are filled through `admit` and `complete`, one transaction each, up to
``--api-up-to``; past it, through the same code a transaction at a time for 2,000 executions
(`_admit_in` and `_complete_in` under one lock of the chain head: the same entries, rows and
hashes), and the whole chain is verified at the end of the run. Prints each path's growth from
the smallest size to the largest (target at most 1.3x) and the store's bytes per execution
(SQLite: the file after a WAL checkpoint; PostgreSQL: every table with its indexes).

``--workloads`` (each a store of its own): ``repeat``, an agent's history, where every
execution carries the same 6 KB manifest and one of 16 scripts of about 1.3 KB (a retry, a
scheduled run or a template filled in again repeats its script verbatim); ``unique``, the same
manifest with a script no other execution has. The bytes per execution of the two bound what
storing a repeated script or manifest once saves.

The history it writes is `bench.scale_history`, the paths it times `bench.scale_paths`; this
module holds the engines' stores, the run at each size and the report of the growth.
"""

import contextlib
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.harness import Report, bench_parser, percentile
from bench.scale_history import WORKLOADS, fill_api, fill_bulk
from bench.scale_paths import BIG, SMALL, SMALL_SIZE, ScaleEngine, measure
from sandbox.audit import open_store

TARGET = 1.3


@contextlib.contextmanager
def _sqlite() -> Iterator[tuple[str, Callable[[str], int]]]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "audit.sqlite3")

        def size(_: str) -> int:
            conn = sqlite3.connect(path)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
            return os.path.getsize(path)

        yield path, size


@contextlib.contextmanager
def postgres_schema(url: str) -> Iterator[tuple[str, Callable[[str], int]]]:
    import psycopg

    schema = f"bench_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in url else "?"
    target = f"{url}{separator}options=-csearch_path%3D{schema}"

    def size(_: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()
        return int(row[0] if row else 0)

    try:
        yield target, size
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def run_engine(
    report: Report,
    name: str,
    target: str,
    size_of: Callable[[str], int],
    sizes: list[int],
    rounds: int,
    api_up_to: int,
    new: int = 1000,
    workload: str = "repeat",
) -> ScaleEngine:
    store = open_store(target, instance="bench")
    engine = ScaleEngine(f"{name} ({workload})", target, lambda: size_of(target), store, workload)
    name = engine.name
    key = Ed25519PrivateKey.generate()
    try:
        fill_api(store, SMALL, 0, SMALL_SIZE)
        for size in sizes:
            started = time.perf_counter()
            api_stop = min(size, max(api_up_to, engine.filled))
            fill_api(store, BIG, engine.filled, api_stop, workload)
            fill_bulk(store, BIG, api_stop, size, workload)
            report.print(
                f"{name}: filled to {size:,} executions in {time.perf_counter() - started:.1f} s "
                f"({api_stop - engine.filled:,} through admit/complete, {size - api_stop:,} in "
                f"batches)"
            )
            engine.filled = size
            measure(engine, size, rounds, key, new)
            report.section(f"{name}, {size:,} executions of {BIG} (+{SMALL_SIZE} of {SMALL})")
            for label, samples in engine.times[size].items():
                report.timings(label, samples)
            report.figure("bytes per execution", engine.bytes_per[size], "B", fmt=".0f")
        started = time.perf_counter()
        verified = store.verify()
        report.print(
            f"{name}: the whole store verifies: {verified.ok} ({verified.records:,} records, "
            f"{time.perf_counter() - started:.1f} s)"
        )
        assert verified.ok, verified.problems[:5]
    finally:
        store.close()
    return engine


def growth(report: Report, engine: ScaleEngine) -> dict[str, float]:
    """p50 at the largest size over p50 at the smallest, per path."""
    sizes = sorted(engine.times)
    low, high = engine.times[sizes[0]], engine.times[sizes[-1]]
    report.section(
        f"{engine.name}: growth of p50 from {sizes[0]:,} to {sizes[-1]:,} executions "
        f"(target at most {TARGET}x)"
    )
    ratios = {}
    for label in low:
        ratio = percentile(high[label], 0.5) / max(percentile(low[label], 0.5), 1e-9)
        ratios[label] = ratio
        report.figure(label, ratio, "x", note="over" if ratio > TARGET else "")
    return ratios


def main(report: Report, args: Any) -> None:
    sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(","))
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"--workloads: unknown workload {unknown[0]!r} ({', '.join(WORKLOADS)})")
    for name, workload in ((n, w) for n in args.engines.split(",") for w in workloads):
        if name == "sqlite":
            context = _sqlite()
        elif name == "postgres":
            url = args.pg_url or os.environ.get("PTC_TEST_POSTGRES_URL", "")
            if not url:
                report.print("postgres: skipped (no --pg-url and no $PTC_TEST_POSTGRES_URL)")
                continue
            context = postgres_schema(url)
        else:
            raise SystemExit(f"--engines: unknown engine {name!r} (sqlite, postgres)")
        with context as (target, size_of):
            engine = run_engine(
                report,
                name,
                target,
                size_of,
                sizes,
                args.rounds,
                args.api_up_to,
                args.new,
                workload,
            )
        if len(sizes) > 1:
            growth(report, engine)


def parser() -> Any:
    options = bench_parser(__doc__, rounds=15)
    options.add_argument("--sizes", default="2000,20000", help="executions of the big tenant")
    options.add_argument("--engines", default="sqlite,postgres", help="sqlite and/or postgres")
    options.add_argument(
        "--api-up-to", type=int, default=100_000, help="fill through admit/complete up to this"
    )
    options.add_argument(
        "--new", type=int, default=1000, help="executions appended before each checkpoint"
    )
    options.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="repeat and/or unique (a store each)"
    )
    options.add_argument("--pg-url", default=None, help="PostgreSQL server (a fresh schema)")
    return options


if __name__ == "__main__":
    arguments = parser().parse_args()
    with Report("store_scale", arguments) as report:
        main(report, arguments)
