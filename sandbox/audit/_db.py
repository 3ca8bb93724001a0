"""The seam between the audit store and its engine: a transaction (`Tx`) and a database (`Db`).

SQLite and PostgreSQL differ only in how a connection is opened, how a write transaction is
serialised and how a snapshot read is taken; `Db` is that seam, and every other module of the
store writes its SQL once against it (``?`` placeholders; the PostgreSQL seam rewrites them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["POSTGRES", "SQLITE", "Db", "Engine", "Tx"]


@dataclass(frozen=True)
class Engine:
    """What differs between the engines, stated once; everything else is the same SQL."""

    name: str
    for_update: str  # appended to the chain-head SELECT that locks it
    # True when a write transaction excludes every other writer from its start (SQLite's
    # ``BEGIN IMMEDIATE``), so a row read before the tenant's chain head is locked is current;
    # False when writers serialise only on that lock (PostgreSQL: read after it).
    serial_writes: bool
    # True when a short read may run on the event loop: a WAL reader never waits for a writer
    # and costs ~0.02 ms there, where a hop to a worker thread and back cost ~0.14 ms of CPU
    # (`sandbox.server.idempotency`); False over a network (PostgreSQL).
    quick_reads: bool


SQLITE = Engine("sqlite", for_update="", serial_writes=True, quick_reads=True)
POSTGRES = Engine("postgresql", for_update=" FOR UPDATE", serial_writes=False, quick_reads=False)


class Tx(Protocol):
    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None: ...

    def stream(self, sql: str, params: Sequence[object] = ()) -> Iterator[tuple[Any, ...]]: ...


class Db(Protocol):
    """One engine's connection handling."""

    engine: Engine

    def write(self) -> AbstractContextManager[Tx]:
        """A write transaction, serialised against other writers of the same store."""

    def read(self) -> AbstractContextManager[Tx]:
        """A read transaction on one consistent snapshot."""

    def read_one(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """One read statement, which is its own snapshot (no explicit transaction around it)."""

    def lock_migrations(self, tx: Tx) -> None: ...

    def close(self) -> None: ...
