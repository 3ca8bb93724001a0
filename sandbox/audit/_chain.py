# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""The chain role of the SQL audit store: appends linked to each tenant's head, and the schema.

Every write is one transaction that locks the tenant's ``chain_heads`` row (``FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers), appends one entry linked to
the head, moves the head, and updates the derived index rows. A crash at any point leaves either
the whole step or none of it, so nothing is half-written. `Chain` is the base of every other role
of the store (`sandbox.audit._sqlcore`): each writes through these appends.
"""

from __future__ import annotations

import builtins
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from sandbox.audit._checking import ENTRY_COLUMNS, EXEC_COLUMNS
from sandbox.audit._codec import Entry, entry_hash
from sandbox.audit._db import Db, Engine, Tx
from sandbox.audit._index import CallRow, ExecRow, ViolationRow, derive
from sandbox.audit._schema import MIGRATIONS, VERSION_TABLE, PerEngine
from sandbox.errors import NotFound

__all__ = ["BATCH", "Chain", "next_entry", "now_us"]

# `Chain.tenants`: a skip scan of the executions index, written out as a recursive CTE (both
# engines read a DISTINCT or UNION of the tenant column as every row of it), with the heads.
_TENANTS = """WITH RECURSIVE walk (tenant) AS (
        SELECT MIN(tenant) FROM executions
        UNION ALL
        SELECT (SELECT MIN(e.tenant) FROM executions e WHERE e.tenant > walk.tenant)
        FROM walk WHERE walk.tenant IS NOT NULL
    )
    SELECT tenant FROM walk WHERE tenant IS NOT NULL
    UNION SELECT tenant FROM chain_heads ORDER BY 1"""

BATCH = 500


def now_us() -> int:
    return time.time_ns() // 1000


class Chain:
    """The store's database, its instance name and its chain appends.

    ``instance`` names this server process's host for `mark_interrupted`: at start-up a server
    marks only the running records *it* admitted, so one server of a fleet restarting never
    marks its siblings' live executions. It defaults to the host name; give each server of a
    fleet a stable, distinct one.
    """

    def __init__(self, db: Db, *, instance: str | None = None) -> None:
        self._db = db
        self.instance = instance or socket.gethostname()
        self._migrate()

    @property
    def engine(self) -> Engine:
        """What differs between SQLite and PostgreSQL, as one typed value."""
        return self._db.engine

    @property
    def quick_reads(self) -> bool:
        """Whether a short read of the store may run on the event loop (`Engine.quick_reads`)."""
        return self._db.engine.quick_reads

    def _migrate(self) -> None:
        with self._db.write() as tx:
            self._db.lock_migrations(tx)
            tx.execute(VERSION_TABLE)
            current = tx.execute("SELECT MAX(version) FROM schema_version")[0][0] or 0
            for version, statements in MIGRATIONS:
                if version <= current:
                    continue
                for step in statements:
                    if isinstance(step, str):
                        tx.execute(step)
                    elif isinstance(step, PerEngine):
                        for statement in step.statements(self._db.engine):
                            tx.execute(statement)
                    else:
                        step(tx)
                tx.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, time.time()),
                )

    def write_probe(self, pad_bytes: int = 0) -> None:
        """Writes this instance's row of ``write_probes`` (with ``pad_bytes`` of padding) in a
        write transaction like any append's: raises `StoreUnavailable` while the store refuses
        writes. Nothing in the chain changes."""
        with self._db.write() as tx:
            tx.execute(
                "INSERT INTO write_probes (instance, at_us, pad) VALUES (?, ?, ?) "
                "ON CONFLICT (instance) DO UPDATE SET at_us = excluded.at_us, pad = excluded.pad",
                (self.instance, now_us(), "0" * pad_bytes),
            )

    def schema_version(self) -> int:
        with self._db.read() as tx:
            return int(tx.execute("SELECT MAX(version) FROM schema_version")[0][0] or 0)

    def tenants(self) -> builtins.list[str]:
        """Every tenant with a chain or an index row (an operator's view; not in the protocol).

        The chain heads are one row per tenant. The executions index is walked tenant to
        tenant (each step the smallest tenant above the last, one descent of
        ``executions_tenant_seq``), so that a row of a tenant with no chain (inserted: `verify`
        of every tenant must see it) is found at the cost of the tenants, not of their
        executions."""
        with self._db.read() as tx:
            rows = tx.execute(_TENANTS)
        return [str(r[0]) for r in rows]

    def _lock_head(self, tx: Tx, tenant: str) -> tuple[int, str]:
        """Locks the tenant's chain head (creating it for a tenant's first entry) and returns
        its (seq, hash). Held to the end of ``tx``: pass it on to `_append`."""
        # Every entry but a tenant's first finds the row: one statement. The first inserts it
        # (two writers racing to do so: the second's insert does nothing) and reads it again.
        lock = (
            "SELECT seq, head_hash FROM chain_heads WHERE tenant = ?" + self._db.engine.for_update
        )
        rows = tx.execute(lock, (tenant,))
        if not rows:
            tx.execute(
                "INSERT INTO chain_heads (tenant, seq, head_hash) VALUES (?, 0, '') "
                "ON CONFLICT (tenant) DO NOTHING",
                (tenant,),
            )
            rows = tx.execute(lock, (tenant,))
        return int(rows[0][0]), str(rows[0][1])

    def _append(
        self,
        tx: Tx,
        tenant: str,
        kind: str,
        execution_id: str,
        payload: str,
        head: tuple[int, str] | None = None,
    ) -> Entry:
        """Appends an entry to the tenant's chain. ``head``: what `_lock_head` returned earlier
        in ``tx`` (the lock holds to its end, so the head cannot have moved); else locked here."""
        entry = next_entry(
            head if head is not None else self._lock_head(tx, tenant),
            tenant,
            kind,
            execution_id,
            payload,
        )
        self._write_entry(tx, entry)
        return entry

    def _write_entry(self, tx: Tx, entry: Entry) -> None:
        """Writes ``entry`` (made by `_next_entry` from the head locked in ``tx``) and moves
        the tenant's chain head to it."""
        tx.execute(
            f"INSERT INTO entries ({ENTRY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.tenant,
                entry.seq,
                entry.kind,
                entry.execution_id,
                entry.at_us,
                entry.payload,
                entry.prev_hash,
                entry.entry_hash,
            ),
        )
        tx.execute(
            "UPDATE chain_heads SET seq = ?, head_hash = ? WHERE tenant = ?",
            (entry.seq, entry.entry_hash, entry.tenant),
        )

    def _tenant_of(self, tx: Tx, execution_id: str) -> str:
        rows = tx.execute("SELECT tenant FROM executions WHERE execution_id = ?", (execution_id,))
        if not rows:
            raise NotFound(f"no admitted execution {execution_id}")
        return str(rows[0][0])

    def _reindex(self, tx: Tx, tenant: str, execution_id: str, entry: Entry, result: Any) -> None:
        # One look-up by (tenant, execution_id), the `entries_execution` index: the execution's
        # admission and its take-overs, a handful of rows. (Asked for the latest take-over
        # alone with ORDER BY seq DESC LIMIT 1, SQLite walked the tenant's whole chain
        # backwards instead: a completion cost more the longer the chain.)
        first: tuple[Any, ...] | None = None
        taken: tuple[Any, ...] | None = None
        for row in tx.execute(
            "SELECT seq, kind, payload, prev_hash FROM entries "
            "WHERE tenant = ? AND execution_id = ? AND kind IN ('admitted', 'taken_over')",
            (tenant, execution_id),
        ):
            if row[1] == "admitted":
                first = row
            elif taken is None or int(row[0]) > int(taken[0]):
                taken = row
        if first is None:
            raise NotFound(f"no admission entry for execution {execution_id}")
        derived = derive(
            tenant,
            int(first[0]),
            json.loads(first[2]),
            str(first[3]),
            entry.kind,
            entry.entry_hash,
            result,
            str(json.loads(taken[2])["instance"]) if taken is not None else None,
        )
        self._write_row(tx, execution_id, derived.row, insert=False)
        self._write_lists(
            tx, tenant, (execution_id, int(first[0])), derived.calls, derived.violations, True
        )

    def _write_lists(
        self,
        tx: Tx,
        tenant: str,
        execution: tuple[str, int],
        calls: Sequence[CallRow],
        violations: Sequence[ViolationRow],
        clear: bool,
    ) -> None:
        """Writes the calls and violations rows of ``execution`` (its id and ``admit_seq``, the
        order lists by tool and violation page in); ``clear``: first deletes the ones an
        earlier completion wrote."""
        execution_id, admit_seq = execution
        if clear:
            tx.execute("DELETE FROM calls WHERE execution_id = ?", (execution_id,))
            tx.execute("DELETE FROM violations WHERE execution_id = ?", (execution_id,))
        if calls:
            tx.executemany(
                "INSERT INTO calls (execution_id, idx, seq, tenant, tool, status, admit_seq) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(execution_id, i, s, tenant, tool, st, admit_seq) for i, s, tool, st in calls],
            )
        if violations:
            tx.executemany(
                "INSERT INTO violations (execution_id, idx, tenant, limit_name, action, admit_seq) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(execution_id, i, tenant, name, act, admit_seq) for i, name, act in violations],
            )

    def _write_row(self, tx: Tx, execution_id: str, row: ExecRow, *, insert: bool) -> bool:
        """Inserts or updates the row; False when an insert found the id already there."""
        values = (
            row.tenant,
            row.admit_seq,
            row.status,
            row.admitted_at,
            row.finished_at,
            row.backend,
            row.script_sha256,
            row.manifest_sha256,
            row.instance,
            row.prev_hash,
            row.record_hash,
            row.session_id,
        )
        if insert:
            return bool(
                tx.execute(
                    f"INSERT INTO executions (execution_id, {EXEC_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id",
                    (execution_id, *values),
                )
            )
        tx.execute(
            "UPDATE executions SET status = ?, finished_at = ?, record_hash = ?, instance = ? "
            "WHERE execution_id = ?",
            (row.status, row.finished_at, row.record_hash, row.instance, execution_id),
        )
        return True

    def close(self) -> None:
        self._db.close()


def next_entry(
    head: tuple[int, str], tenant: str, kind: str, execution_id: str, payload: str
) -> Entry:
    """The entry that follows ``head`` (locked by `_lock_head`), hashed, not yet written."""
    seq, head_hash = head
    at_us = now_us()
    digest = entry_hash(tenant, seq + 1, kind, execution_id, at_us, payload, head_hash)
    return Entry(tenant, seq + 1, kind, execution_id, at_us, payload, head_hash, digest)
