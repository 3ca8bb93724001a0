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
"""

from __future__ import annotations

import random
import time
from typing import Any

from bench.harness import Report, bench_parser, percentile
from sandbox.audit import is_postgres_url, open_store

SETTINGS = {"copied": "PRAGMA mmap_size=0", "mapped": ""}  # "": as the store opens it
PG_SETTINGS = {"as opened": ""}


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


def parser() -> Any:
    options = bench_parser(__doc__, rounds=1)
    options.add_argument("--stores", required=True, help="PATH:TENANT:SIZE, comma-separated")
    options.add_argument("--lookups", type=int, default=10_000, help="random look-ups per run")
    return options


if __name__ == "__main__":
    arguments = parser().parse_args()
    with Report("point_reads", arguments) as report:
        main(report, arguments)
