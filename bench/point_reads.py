"""The store's two point reads (get by id, the idempotency look-up) on stores of any size: SQLite
with the file read through a memory map (the store's setting) and with pages copied (before),
PostgreSQL as the store opens it.

    .venv/bin/python -m bench.point_reads --stores PATH:TENANT:SIZE[,...] [--lookups 10000]

Each store is a SQLite file ``bench.store_scale`` or ``bench.session_rebuild --store`` filled,
or a PostgreSQL URL ``bench.store_copy`` copied such a file to:
``SIZE`` executions of ``TENANT`` with ids ``TENANT-000000000`` on and an idempotency key
``key-N`` on every fourth. One connection per store and setting, ``--lookups`` random ids and keys
from the middle half of the history, each store's settings run in turn (copied, mapped) twice;
prints the p50 of each. ``bench.store_scale`` times the same calls 15 times a size among every
other path; this is the close look at the two that grew.

Then a look inside the idempotency look-up, below the store's code: on SQLite the bare statement
through a read-only ``sqlite3`` connection mapped as the store maps it, with the same random keys
and with one key again and again (every page it reads stays in the CPU caches: what is left of
the growth is the B-tree's depth); on PostgreSQL ``EXPLAIN (ANALYZE, BUFFERS)`` of up to 100
random keys, the plan's first node and the buffers a look-up touches (found in shared buffers,
read from the OS). Opening a store migrates it: time an older schema with the older code.
"""

from __future__ import annotations

import random
import re
import sqlite3
import time
from typing import Any

from bench.harness import Report, bench_parser, percentile
from sandbox.audit import is_postgres_url, open_store

SETTINGS = {"copied": "PRAGMA mmap_size=0", "mapped": ""}  # "": as the store opens it
PG_SETTINGS = {"as opened": ""}
LOOKUP = "SELECT execution_id FROM idempotency_keys WHERE tenant = ? AND idem_key = ?"


def _keys(size: int, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        m = rng.randrange(size // 4, size // 4 * 3)
        out.append(f"key-{m - m % 4}")
    return out


def _bare_p50(conn: sqlite3.Connection, tenant: str, keys: list[str]) -> float:
    for key in keys[:200]:  # the statement prepared, the root pages touched
        conn.execute(LOOKUP, (tenant, key)).fetchall()
    samples = []
    for key in keys:
        started = time.perf_counter()
        assert conn.execute(LOOKUP, (tenant, key)).fetchall(), key
        samples.append(time.perf_counter() - started)
    return percentile(samples, 0.5)


def look_inside(report: Report, path: str, tenant: str, size: int, lookups: int) -> None:
    """The idempotency look-up below the store's code (see the module's docstring)."""
    keys = _keys(size, lookups, seed=3)
    if not is_postgres_url(path):
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            conn.execute("PRAGMA mmap_size=2147483648")  # as `sandbox.audit.sqlite` maps it
            random_p50 = _bare_p50(conn, tenant, keys)
            one_p50 = _bare_p50(conn, tenant, keys[:1] * lookups)
        finally:
            conn.close()
        report.figure(f"{size:,}, bare statement: idempotency p50", random_p50 * 1e6, "us")
        report.figure(f"{size:,}, bare statement, one key: idempotency p50", one_p50 * 1e6, "us")
        return
    import psycopg

    hit = read = 0
    nodes = set()
    sample = keys[:100]
    with psycopg.connect(path, autocommit=True) as pg:
        explain = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + LOOKUP.replace("?", "%s")
        for key in sample:
            plan = [str(row[0]) for row in pg.execute(explain, (tenant, key)).fetchall()]
            nodes.add(plan[0].split(" (")[0])
            buffers = next(line for line in plan if "Buffers:" in line)
            hit += int(next(iter(re.findall(r"hit=(\d+)", buffers)), "0"))
            read += int(next(iter(re.findall(r"read=(\d+)", buffers)), "0"))
    report.print(f"   {size:,}: the look-up's plan: {' | '.join(sorted(nodes))}")
    report.figure(f"{size:,}: buffers a look-up finds in memory", hit / len(sample), "")
    report.figure(f"{size:,}: buffers a look-up reads from the OS", read / len(sample), "")


def measure(report: Report, path: str, tenant: str, size: int, lookups: int) -> None:
    for run in (1, 2):
        for name, pragma in (PG_SETTINGS if is_postgres_url(path) else SETTINGS).items():
            store = open_store(path, instance="bench")
            try:
                if pragma:
                    store._db._conn.execute(pragma)  # type: ignore[attr-defined]
                rng = random.Random(run)
                gets, keys = [], []
                for _ in range(lookups):
                    m = rng.randrange(size // 4, size // 4 * 3)
                    started = time.perf_counter()
                    found = store.get(tenant, f"{tenant}-{m:09d}")
                    gets.append(time.perf_counter() - started)
                    assert found is not None, m
                    m -= m % 4
                    started = time.perf_counter()
                    assert store.by_key(tenant, f"key-{m}") is not None, m
                    keys.append(time.perf_counter() - started)
            finally:
                store.close()
            report.figure(
                f"{size:,}, {name}, run {run}: get by id p50", percentile(gets, 0.5) * 1e6, "us"
            )
            report.figure(
                f"{size:,}, {name}, run {run}: idempotency p50", percentile(keys, 0.5) * 1e6, "us"
            )


def main(report: Report, args: Any) -> None:
    for spec in args.stores.split(","):
        path, tenant, size = spec.rsplit(":", 2)
        report.section(f"{int(size):,} executions of {tenant!r} ({path})")
        measure(report, path, tenant, int(size), args.lookups)
        look_inside(report, path, tenant, int(size), args.lookups)


def parser() -> Any:
    options = bench_parser(__doc__, rounds=1)
    options.add_argument("--stores", required=True, help="PATH:TENANT:SIZE, comma-separated")
    options.add_argument("--lookups", type=int, default=10_000, help="random look-ups per run")
    return options


if __name__ == "__main__":
    arguments = parser().parse_args()
    with Report("point_reads", arguments) as report:
        main(report, arguments)
