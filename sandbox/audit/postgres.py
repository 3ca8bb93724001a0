"""The PostgreSQL audit store: one database shared by a fleet of servers (psycopg 3).

Same schema and logic as SQLite (`sandbox.audit._sqlcore`); what differs is concurrency. Each
chain append runs in one transaction that first locks the tenant's ``chain_heads`` row with
``SELECT ... FOR UPDATE``, so appends from many servers to one tenant's chain are serialised
while different tenants append in parallel. Migrations take a transaction-scoped advisory lock,
so servers starting together migrate once. Reads that verify a chain run at ``REPEATABLE READ``
to see one snapshot. A broken connection is reopened on the next operation; a failure reaches
the caller as `StoreUnavailable`. Requires the ``postgres`` extra (``psycopg[binary]``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sandbox.audit._db import POSTGRES, Tx
from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.errors import StoreUnavailable, Unavailable

__all__ = ["PostgresAuditStore"]

_MIGRATION_LOCK = 0x70746361  # "ptca": the advisory lock key that serialises migrations
_cursor_names = itertools.count()


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


class _Tx:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._conn.cursor() as cursor:
            cursor.execute(_pg(sql), params)
            return list(cursor.fetchall()) if cursor.description else []

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(_pg(sql), rows)

    def stream(self, sql: str, params: Sequence[object] = ()) -> Iterator[tuple[Any, ...]]:
        with self._conn.cursor(name=f"ptc_audit_{next(_cursor_names)}") as cursor:
            cursor.itersize = 2000
            cursor.execute(_pg(sql), params)
            yield from cursor


class _PostgresDb:
    engine = POSTGRES

    def __init__(self, url: str, connect_timeout_s: int) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise Unavailable(
                "the PostgreSQL audit store needs psycopg: pip install 'ptc-sandbox[postgres]'"
            ) from exc
        self._psycopg = psycopg
        self._url = url
        self._timeout = connect_timeout_s
        self._lock = threading.RLock()
        self._conn: Any = None
        self._connect()

    def _connect(self) -> None:
        try:
            self._conn = self._psycopg.connect(
                self._url, autocommit=True, connect_timeout=self._timeout
            )
        except self._psycopg.Error as exc:
            raise StoreUnavailable(f"audit store: cannot connect to PostgreSQL: {exc}") from exc

    @contextmanager
    def _transaction(self, isolation: str | None) -> Iterator[_Tx]:
        with self._lock:
            if self._conn.closed or self._conn.broken:
                self._connect()
            try:
                with self._conn.transaction():
                    if isolation:
                        self._conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
                    yield _Tx(self._conn)
            except self._psycopg.Error as exc:
                raise StoreUnavailable(f"audit store: PostgreSQL failed: {exc}") from exc

    def write(self) -> AbstractContextManager[_Tx]:
        return self._transaction(None)

    def read(self) -> AbstractContextManager[_Tx]:
        return self._transaction("REPEATABLE READ")

    def read_one(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        # The connection is in autocommit mode: the statement is its own transaction, one
        # snapshot, without the BEGIN, SET TRANSACTION and COMMIT round trips of `read`.
        with self._lock:
            if self._conn.closed or self._conn.broken:
                self._connect()
            try:
                return _Tx(self._conn).execute(sql, params)
            except self._psycopg.Error as exc:
                raise StoreUnavailable(f"audit store: PostgreSQL failed: {exc}") from exc

    def lock_migrations(self, tx: Tx) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PostgresAuditStore(SqlAuditStore):
    """The audit store in a PostgreSQL database named by a ``postgresql://`` URL."""

    def __init__(
        self, url: str, *, instance: str | None = None, connect_timeout_s: int = 10
    ) -> None:
        super().__init__(_PostgresDb(url, connect_timeout_s), instance=instance)
