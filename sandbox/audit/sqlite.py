"""The SQLite audit store: one file in WAL mode, the embedded default.

WAL lets `ptc audit` read while a server writes, and a process killed mid-transaction leaves
the file at its last commit. The log is checkpointed by a thread of the writer's
(`sandbox.audit.wal_checkpointer`), not inside the commits the server makes on its event loop.
``synchronous=NORMAL`` (the default here) survives any crash of the process, which is the crash
model of the contract (kill -9 of the server); ``FULL`` also survives power loss at the cost of
an fsync per commit. Writers, also from other processes, are serialised by ``BEGIN IMMEDIATE``;
the file is created readable by its owner only, since it holds scripts and their output.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

from sandbox.audit._db import SQLITE, Tx
from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.audit.wal_checkpointer import BACKSTOP_PAGES, WalCheckpointer
from sandbox.errors import StoreUnavailable

log = logging.getLogger(__name__)

__all__ = ["SQLiteAuditStore"]

Synchronous = Literal["normal", "full"]

# Reads of the database file through a memory map rather than a copy of each page into the
# connection's own page cache (2 MB by default): a look-up by key (`get`, `by_key`) on a store
# of a million executions touches pages all over a file of gigabytes, and each page it had to
# copy cost it more than the search itself (measured: `bench.store_scale`). 2 GiB is also the
# most SQLite maps whatever is asked (``SQLITE_MAX_MMAP_SIZE``, 0x7fff0000 in Debian's build):
# pages past it are copied as before, 41% of the idempotency keys' tree at a million executions.
# The page cache stays at its default: 64 MiB kept those pages but did not move the look-up's
# p50 (`bench.point_reads`, docs/benchmarks.md). Writes still go through the WAL.
MMAP_BYTES = 1 << 31


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
    engine = SQLITE

    def __init__(self, path: str, synchronous: Synchronous, busy_timeout_s: float) -> None:
        if path != ":memory:" and not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        try:
            self._conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_s
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            if path != ":memory:":  # the checkpoints are the checkpointer's thread's
                self._conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
                self._conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"audit store {path}: {exc}") from exc
        self._path = path
        self._lock = threading.RLock()
        # Set by the store once it is open: its own migrations do not start the thread.
        self.checkpointer: WalCheckpointer | None = None

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[_Tx]:
        with self._lock:
            try:
                self._conn.execute(begin)
            except sqlite3.Error as exc:
                raise self._refused(exc) from exc
            try:
                yield _Tx(self._conn)
                self._conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error) and _store_refused(exc):
                    raise self._refused(exc) from exc
                raise

    def _rollback(self) -> None:
        """Rolls back what is still open. SQLite has already rolled back a transaction that
        failed with a full disk or an I/O error, and a ROLLBACK then fails ("cannot rollback -
        no transaction is active"): that error must never replace the one that ended it."""
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("audit store %s: rollback failed: %s", self._path, exc)

    def _refused(self, exc: sqlite3.Error) -> StoreUnavailable:
        return StoreUnavailable(f"audit store {self._path}: {exc}")

    def write(self) -> AbstractContextManager[_Tx]:
        if self.checkpointer is not None and not self.checkpointer.running:
            self.checkpointer.start()  # at the first write: a reader never has the thread
        return self._transaction("BEGIN IMMEDIATE")

    def read(self) -> AbstractContextManager[_Tx]:
        return self._transaction("BEGIN")

    def read_one(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        # In autocommit mode SQLite wraps the statement in its own read transaction, one WAL
        # snapshot: the same as BEGIN, the statement, COMMIT, without running those two.
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                if _store_refused(exc):
                    raise self._refused(exc) from exc
                raise

    def lock_migrations(self, tx: Tx) -> None:
        """``BEGIN IMMEDIATE`` already excludes other writers, migrators included."""

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        with self._lock:
            self._conn.close()


def _store_refused(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is the store refusing (a full disk, a read-only or locked file, an I/O
    error, a corrupt file) rather than a bug in the SQL (a constraint, a wrong statement)."""
    return isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError


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
        db = _SQLiteDb(self.path, synchronous, busy_timeout_s)
        super().__init__(db, instance=instance)
        if self.path != ":memory:":
            db.checkpointer = WalCheckpointer(self.path)
