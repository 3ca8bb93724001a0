"""A SQLite audit store's rows copied into an empty PostgreSQL store: the bulk path to a
PostgreSQL store of a million executions.

    .venv/bin/python -m bench.store_copy --source FILE --target URL

The store's own admission and completion code (`bench.store_scale`'s bulk fill, 2,000
executions a transaction) writes about 4,000 executions a second into SQLite on the 2-core VM
the figures were taken on, and about 100-360 a second into PostgreSQL, where each of the ten or
so statements of an execution is a round trip: one to three hours for a million. The rows that
code writes are the same on both engines (the chain's hashes cover the payloads, never the
engine), so a SQLite file filled by it is copied table by table with ``COPY`` into the store
``URL`` names, which this code opens first (creating its tables at this code's schema version,
which must be the file's) and which must hold nothing yet. Then ``VACUUM ANALYZE``, as a store
that grew over days has been vacuumed and analysed by autovacuum; and the whole chain is
verified on PostgreSQL, index rows included: a copy that does not verify is refused.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from bench.harness import Report, bench_parser
from sandbox.audit import open_store

__all__ = ["copy_store"]


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "AND name != 'schema_version' ORDER BY name"
    )
    return [str(name) for (name,) in rows]


def copy_store(source: str, target: str, report: Report) -> int:
    """Copies every row of the SQLite store ``source`` into the empty store ``target``
    (PostgreSQL) and verifies the copy; returns the rows copied."""
    import psycopg

    store = open_store(target, instance="bench-copy")  # its tables, at this code's version
    version = store.schema_version()
    store.close()
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    copied, tables = 0, _tables(conn)
    try:
        (have,) = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        if int(have) != version:
            raise SystemExit(f"{source} is at schema version {have}, this code at {version}")
        with psycopg.connect(target) as pg:
            for table in tables:
                (rows,) = pg.execute(f"SELECT COUNT(*) FROM {table}").fetchone()  # type: ignore[misc]
                if table not in ("fleet_secret", "write_probes") and rows:
                    raise SystemExit(f"{target}: {table} already holds {rows} rows")
                pg.execute(f"DELETE FROM {table}")
                started = time.perf_counter()
                cursor = conn.execute(f"SELECT * FROM {table}")
                columns = ", ".join(d[0] for d in cursor.description)
                count = 0
                with pg.cursor().copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in cursor:
                        copy.write_row(row)
                        count += 1
                copied += count
                report.print(f"{table}: {count:,} rows in {time.perf_counter() - started:.1f} s")
        with psycopg.connect(target, autocommit=True) as pg:
            started = time.perf_counter()
            for table in tables:
                pg.execute(f"VACUUM ANALYZE {table}")
            report.print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")
    finally:
        conn.close()
    store = open_store(target, instance="bench-copy")
    try:
        started = time.perf_counter()
        verified = store.verify()
        report.print(
            f"the copy verifies: {verified.ok} ({verified.records:,} records, "
            f"{time.perf_counter() - started:.1f} s)"
        )
        if not verified.ok:
            raise SystemExit(f"the copy does not verify: {verified.problems[:5]}")
    finally:
        store.close()
    return copied


def main(report: Report, args: Any) -> None:
    started = time.perf_counter()
    copied = copy_store(args.source, args.target, report)
    report.print(f"copied {copied:,} rows in {time.perf_counter() - started:.1f} s")


def parser() -> Any:
    options = bench_parser(__doc__, rounds=1)
    options.add_argument("--source", required=True, help="the SQLite store (a file)")
    options.add_argument("--target", required=True, help="an empty PostgreSQL store (a URL)")
    return options


if __name__ == "__main__":
    arguments = parser().parse_args()
    with Report("store_copy", arguments) as report:
        main(report, arguments)
