"""The store's two point reads (get by id, the idempotency look-up) on stores of any size: SQLite
with the file read through a memory map (the store's setting), with pages copied (before) and
mapped with a page cache of 64 MiB instead of 2 MB (measured, not taken: issue 38), PostgreSQL as
the store opens it.

    .venv/bin/python -m bench.point_reads --stores PATH:TENANT:SIZE[,...] [--lookups 10000]

Each store is a SQLite file ``bench.store_scale`` or ``bench.session_rebuild --store`` filled,
or a PostgreSQL URL ``bench.store_copy`` copied such a file to:
``SIZE`` executions of ``TENANT`` with ids ``TENANT-000000000`` on and an idempotency key
``key-N`` on every fourth. One connection per store and setting, ``--lookups`` random ids and keys
from the middle half of the history, each look-up after a get by id, each store's settings run
in turn (copied, mapped, mapped with the larger cache) twice; prints the p50 of each.
``bench.store_scale`` times the same calls 15 times a size among every other path; this is the
close look at the two that grew.

Then a look inside the idempotency look-up, below the store's code: on SQLite where the keys'
tree lies (how many of its pages past the 2 GiB the map covers, each read by a copy into the
page cache, and in how many 2 MiB stretches of the file), then the bare statement through a
read-only ``sqlite3`` connection mapped as the store maps it: the same random keys in the
store's file and in a copy of the keys' table in a file of its own (the same B-tree, its pages
side by side and all mapped), each alone and each after a get by id (untimed: what a request
does between two look-ups), twice; and one key again and again (every page it reads stays in
the CPU caches: what is left of the growth is the B-tree's depth). On PostgreSQL ``EXPLAIN
(ANALYZE, BUFFERS)`` of up to 100 random keys, the plan's first node and the buffers a look-up
touches (found in shared buffers, read from the OS). Opening a store migrates it: time an older
schema with the older code.
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.harness import Report, bench_parser, percentile
from sandbox.audit import is_postgres_url, open_store

# "": as the store opens it. 64 MiB of page cache holds every page of the keys' tree that lies
# past the map at a million executions (1,127 of 2,759 pages) beside what a get reads.
SETTINGS = {
    "copied": "PRAGMA mmap_size=0",
    "mapped": "",
    "mapped, 64 MiB cache": "PRAGMA cache_size=-65536",
}
PG_SETTINGS = {"as opened": ""}
LOOKUP = "SELECT execution_id FROM idempotency_keys WHERE tenant = ? AND idem_key = ?"


def _keys(size: int, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        m = rng.randrange(size // 4, size // 4 * 3)
        out.append(f"key-{m - m % 4}")
    return out


Between = Callable[[str], object]


def _bare_p50(
    conn: sqlite3.Connection, tenant: str, keys: list[str], between: Between | None = None
) -> float:
    """The bare statement's p50 over ``keys``; with ``between``, called with each key before
    its look-up (untimed), as a get by id precedes each look-up in `measure`."""
    for key in keys[:200]:  # the statement prepared, the root pages touched
        conn.execute(LOOKUP, (tenant, key)).fetchall()
    samples = []
    for key in keys:
        if between is not None:
            between(key)
        started = time.perf_counter()
        assert conn.execute(LOOKUP, (tenant, key)).fetchall(), key
        samples.append(time.perf_counter() - started)
    return percentile(samples, 0.5)


def _mapped(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.execute("PRAGMA mmap_size=2147483648")  # as `sandbox.audit.sqlite` maps it
    return conn


def _tree_figures(report: Report, conn: sqlite3.Connection, path: str, size: int) -> None:
    """Where the keys' tree lies in the file: SQLite maps at most its compile-time ceiling
    (``PRAGMA mmap_size`` reads back what it took) and copies a page past it into the page
    cache; pages far apart each need a page-table walk of their own."""
    mapped = int(conn.execute("PRAGMA mmap_size").fetchone()[0])
    page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    pages = [
        int(row[0])
        for row in conn.execute("SELECT pageno FROM dbstat WHERE name = 'idempotency_keys'")
    ]
    past = sum(1 for n in pages if n * page > mapped)
    stretches = len({n * page >> 21 for n in pages})
    report.print(
        f"   {size:,}: the keys' tree: {len(pages):,} pages, {past:,} past the map "
        f"({mapped / 2**30:.2f} GiB), in {stretches:,} stretches of 2 MiB of a file of "
        f"{os.path.getsize(path) / 2**20:,.0f} MiB"
    )


def _own_file(path: str, directory: str) -> str:
    """A copy of the store's keys' table in a file of its own, its rows written in the order
    the store took them (execution ids are in admission order here), so that its B-tree has
    the store's shape with its pages side by side."""
    copy = os.path.join(directory, "keys.sqlite3")
    writer = sqlite3.connect(copy, uri=True, isolation_level=None)
    try:
        writer.execute("PRAGMA journal_mode=WAL")  # as the store's file: a reader's locks alike
        writer.execute("ATTACH ? AS store", (f"file:{path}?mode=ro",))
        writer.execute(
            "CREATE TABLE idempotency_keys (tenant TEXT NOT NULL, idem_key TEXT NOT NULL, "
            "execution_id TEXT NOT NULL, PRIMARY KEY (tenant, idem_key)) WITHOUT ROWID"
        )
        writer.execute(
            "INSERT INTO main.idempotency_keys SELECT tenant, idem_key, execution_id "
            "FROM store.idempotency_keys ORDER BY execution_id"
        )
    finally:
        writer.close()
    return copy


def _sqlite_inside(report: Report, path: str, tenant: str, size: int, keys: list[str]) -> None:
    store = open_store(path, instance="bench")

    def get(key: str) -> object:  # the execution that took the key (``key-N``: N)
        return store.get(tenant, f"{tenant}-{int(key.rsplit('-', 1)[1]):09d}")

    figures = {}
    try:
        with tempfile.TemporaryDirectory() as directory:
            own_path = _own_file(path, directory)
            conn, own = _mapped(path), _mapped(own_path)
            try:
                _tree_figures(report, conn, path, size)
                for run in (1, 2):
                    for gets in (False, True):
                        after = ", each after a get" if gets else ""
                        between = get if gets else None
                        for name, db in (("store's file", conn), ("tree in its own file", own)):
                            label = f"{size:,}, bare, {name}{after}, run {run}: p50"
                            figures[label] = _bare_p50(db, tenant, keys, between)
                figures[f"{size:,}, bare, store's file, one key: p50"] = _bare_p50(
                    conn, tenant, keys[:1] * len(keys)
                )
            finally:
                conn.close()
                own.close()
    finally:
        store.close()
    for label, p50 in figures.items():
        report.figure(label, p50 * 1e6, "us")


def look_inside(report: Report, path: str, tenant: str, size: int, lookups: int) -> None:
    """The idempotency look-up below the store's code (see the module's docstring)."""
    keys = _keys(size, lookups, seed=3)
    if not is_postgres_url(path):
        _sqlite_inside(report, path, tenant, size, keys)
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
