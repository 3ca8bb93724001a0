"""The SQLite audit store: one file in WAL mode, the embedded default.

WAL lets `ptc audit` read while a server writes, and a process killed mid-transaction leaves
the file at its last commit. ``synchronous=NORMAL`` (the default here) survives any crash of the
process, which is the crash model of the contract (kill -9 of the server); ``FULL`` also
survives power loss at the cost of an fsync per commit. Writers, also from other processes,
are serialised by ``BEGIN IMMEDIATE``; the file is created readable by its owner only, since it
holds scripts and their output.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

from sandbox.audit._sqlcore import SqlAuditStore, Tx
from sandbox.errors import Unavailable

__all__ = ["SQLiteAuditStore"]

Synchronous = Literal["normal", "full"]


class _Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._conn.executemany(sql, rows)

    def stream(self, sql: str, params: Sequence[object] = ()) -> Iterator[tuple[Any, ...]]:
        cursor = self._conn.execute(sql, params)
        try:
            while batch := cursor.fetchmany(1000):
                yield from batch
        finally:
            cursor.close()


class _SQLiteDb:
    for_update = ""

    def __init__(self, path: str, synchronous: Synchronous, busy_timeout_s: float) -> None:
        if path != ":memory:" and not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        except sqlite3.Error as exc:
            raise Unavailable(f"audit store {path}: {exc}") from exc
        self._path = path
        self._lock = threading.RLock()

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[_Tx]:
        with self._lock:
            try:
                self._conn.execute(begin)
            except sqlite3.Error as exc:
                raise Unavailable(f"audit store {self._path}: {exc}") from exc
            try:
                yield _Tx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.execute("ROLLBACK")
                raise Unavailable(f"audit store {self._path}: {exc}") from exc

    def write(self) -> AbstractContextManager[_Tx]:
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> AbstractContextManager[_Tx]:
        return self._transaction("BEGIN")

    def lock_migrations(self, tx: Tx) -> None:
        """``BEGIN IMMEDIATE`` already excludes other writers, migrators included."""

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class SQLiteAuditStore(SqlAuditStore):
    """The audit store in one SQLite file (created, migrated and set to WAL on open)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        instance: str | None = None,
        synchronous: Synchronous = "normal",
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = os.fspath(path)
        super().__init__(_SQLiteDb(self.path, synchronous, busy_timeout_s), instance=instance)
