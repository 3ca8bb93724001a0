"""Step 11's autovacuum settings on PostgreSQL do what they are there for.

A look-up of an idempotency key is an index-only scan (the primary key carries
``execution_id``), and it reads no heap page only where the table's visibility map says the page
is all-visible, which only a vacuum sets. Step 11 tells autovacuum to visit ``idempotency_keys``
after every 10,000 new keys whatever the table's size; PostgreSQL's default waits for 1,000 plus
20% of the table's rows (21,000 on a table of 100,000 keys), and until then every look-up of a
newer key reads its heap page as well.

The test gives two tables the same history, 100,000 keys vacuumed and then 11,000 new ones: the
store's own, and one of the same shape with PostgreSQL's defaults. Both are past the threshold
at which autovacuum analyzes a table (50 plus 10% of its rows), so a round of autovacuum that
looked at the database analyzes both: it must vacuum the store's table (after which a new key's
look-up fetches no heap page) and not the other (whose look-up still does). Autovacuum looks
every ``autovacuum_naptime`` (a minute by default), a server setting: the test sets it to a
second with ALTER SYSTEM, so it runs a `PrivateCluster` of its own, never the shared server.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from sandbox.audit import open_store
from tests.postgres_support import private_cluster

pytestmark = pytest.mark.requires_postgres

STORES, DEFAULTS = "idempotency_keys", "default_keys"
OLD, NEW = 100_000, 11_000
LOOKUP = "SELECT execution_id FROM {table} WHERE tenant = %s AND idem_key = %s"
NEW_KEY = ("t1", f"new-{NEW // 2}")


def _configure(pg: Any, **settings: str) -> None:
    for name, value in settings.items():
        pg.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    pg.execute("SELECT pg_reload_conf()")


def _insert(pg: Any, table: str, prefix: str, count: int) -> None:
    pg.execute(
        f"INSERT INTO {table} (tenant, idem_key, execution_id) "
        f"SELECT 't1', '{prefix}-' || n, 'x-{prefix}-' || n FROM generate_series(1, {count}) n"
    )


def _inserted_since_vacuum(pg: Any, table: str) -> int:
    row = pg.execute(
        "SELECT n_ins_since_vacuum FROM pg_stat_user_tables "
        "WHERE relname = %s AND schemaname = current_schema()",
        (table,),
    ).fetchone()
    return int(row[0])


def _counted(pg: Any, table: str, inserted: int) -> None:
    """Waits until the statistics autovacuum reads count ``inserted`` rows since the last
    vacuum: a backend sends its counts some time after its transaction (up to a second on
    PostgreSQL 15), and counts that arrived after a VACUUM would be taken as new rows."""
    _wait_for(
        f"{table}: {inserted:,} rows counted", lambda: _inserted_since_vacuum(pg, table) == inserted
    )


def _counts(pg: Any, table: str) -> tuple[int, int]:
    """(autovacuum_count, autoanalyze_count) of ``table``."""
    row = pg.execute(
        "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
        "WHERE relname = %s AND schemaname = current_schema()",
        (table,),
    ).fetchone()
    return int(row[0]), int(row[1])


def _heap_fetches(pg: Any, table: str) -> int:
    """The heap pages an index-only scan read to look up `NEW_KEY` in ``table``."""
    plan = [
        str(row[0])
        for row in pg.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + LOOKUP.format(table=table),
            NEW_KEY,
        ).fetchall()
    ]
    assert plan[0].startswith("Index Only Scan"), plan
    return int(next(m.group(1) for line in plan if (m := re.search(r"Heap Fetches: (\d+)", line))))


def _wait_for(what: str, check: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not seen within {timeout_s:.0f} s: {what}"
        time.sleep(0.2)


def test_autovacuum_visits_the_keys_table_after_10000_new_keys_whatever_its_size() -> None:
    import psycopg

    with private_cluster() as cluster:
        open_store(cluster.url, instance="test-host").close()  # the schema, step 11 included
        with psycopg.connect(cluster.url, autocommit=True) as pg:
            _configure(pg, autovacuum="off")  # nothing visits while the history is written
            pg.execute(f"CREATE TABLE {DEFAULTS} (LIKE {STORES} INCLUDING ALL)")
            options = "SELECT reloptions FROM pg_class WHERE relname = %s"
            assert pg.execute(options, (STORES,)).fetchone() == (
                [
                    "autovacuum_vacuum_insert_scale_factor=0",
                    "autovacuum_vacuum_insert_threshold=10000",
                ],
            )
            assert pg.execute(options, (DEFAULTS,)).fetchone() == (None,)
            for table in (STORES, DEFAULTS):
                _insert(pg, table, "old", OLD)
                _counted(pg, table, OLD)
                pg.execute(f"VACUUM ANALYZE {table}")
                _counted(pg, table, 0)
                _insert(pg, table, "new", NEW)
                _counted(pg, table, NEW)
                # Not vacuumed since: the new key's heap page is read to see the row is visible.
                assert _heap_fetches(pg, table) == 1, table
            before = {table: _counts(pg, table) for table in (STORES, DEFAULTS)}

            _configure(pg, autovacuum="on", autovacuum_naptime="1s")
            _wait_for(
                "the keys' table vacuumed and the other table analyzed",
                lambda: (
                    _counts(pg, STORES)[0] > before[STORES][0]
                    and _counts(pg, DEFAULTS)[1] > before[DEFAULTS][1]
                ),
            )
            assert _heap_fetches(pg, STORES) == 0
            # The round that analyzed the other table left it unvacuumed: 11,000 new keys are
            # under PostgreSQL's default threshold for a table of 100,000.
            assert _counts(pg, DEFAULTS)[0] == before[DEFAULTS][0]
            assert _heap_fetches(pg, DEFAULTS) == 1
