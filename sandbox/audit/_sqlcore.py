# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""The SQL audit store: chain appends, queries, interruption, retention, over a tiny DB seam.

SQLite and PostgreSQL differ only in how a connection is opened, how a write transaction is
serialised and how a snapshot read is taken; `Db` is that seam and everything else is here, with
SQL written once (``?`` placeholders; the PostgreSQL seam rewrites them).

Every write is one transaction that locks the tenant's ``chain_heads`` row (``FOR UPDATE`` on
PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already serialises writers), appends one entry linked to
the head, moves the head, and updates the derived index rows. A crash at any point leaves either
the whole step or none of it, so nothing is half-written.
"""

from __future__ import annotations

import builtins
import json
import socket
import time
from collections.abc import Sequence
from typing import Any

from sandbox.audit import _fleet, _frontiers, _sessions
from sandbox.audit._checking import ENTRY_COLUMNS, EXEC_COLUMNS, verify_in
from sandbox.audit._codec import (
    Entry,
    admission_from_json,
    admission_to_json,
    canonical,
    entry_hash,
    result_from_json,
    result_to_json,
)
from sandbox.audit._db import Db, Tx
from sandbox.audit._index import CallRow, ExecRow, ViolationRow, derive, ended
from sandbox.audit._listing import page, page_size
from sandbox.audit._schema import MIGRATIONS, VERSION_TABLE
from sandbox.audit.base import (
    Admission,
    AuditQuery,
    AuditRecord,
    DeadServer,
    Holder,
    KeyTaken,
    Member,
    SessionRecord,
    VerifyReport,
)
from sandbox.audit.frontier import Frontier
from sandbox.errors import InvalidArgument, NotFound
from sandbox.result import ExecutionResult

__all__ = ["Db", "SqlAuditStore", "Tx"]

_BATCH = 500


def _now_us() -> int:
    return time.time_ns() // 1000


class SqlAuditStore:
    """An `AuditStore` over any `Db`.

    ``instance`` names this server process's host for `mark_interrupted`: at start-up a server
    marks only the running records *it* admitted, so one server of a fleet restarting never
    marks its siblings' live executions. It defaults to the host name; give each server of a
    fleet a stable, distinct one.
    """

    def __init__(self, db: Db, *, instance: str | None = None) -> None:
        self._db = db
        self.instance = instance or socket.gethostname()
        self._migrate()

    # -- schema ------------------------------------------------------------------------------

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
                (self.instance, _now_us(), "0" * pad_bytes),
            )

    def schema_version(self) -> int:
        with self._db.read() as tx:
            return int(tx.execute("SELECT MAX(version) FROM schema_version")[0][0] or 0)

    # -- chain appends -----------------------------------------------------------------------

    def _lock_head(self, tx: Tx, tenant: str) -> tuple[int, str]:
        """Locks the tenant's chain head (creating it for a tenant's first entry) and returns
        its (seq, hash). Held to the end of ``tx``: pass it on to `_append`."""
        # Every entry but a tenant's first finds the row: one statement. The first inserts it
        # (two writers racing to do so: the second's insert does nothing) and reads it again.
        lock = "SELECT seq, head_hash FROM chain_heads WHERE tenant = ?" + self._db.for_update
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
        entry = _next_entry(
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

    def admit(self, admission: Admission) -> None:
        data, payload = self._admission_payload(admission)
        with self._db.write() as tx:
            # The tenant's chain head is locked first (FOR UPDATE on PostgreSQL; SQLite's write
            # transaction is already exclusive), so two servers admitting the same key
            # serialise here and the second one sees the first one's row.
            self._admit_in(tx, admission, data, payload, self._lock_head(tx, admission.tenant))

    def _admission_payload(self, admission: Admission) -> tuple[dict[str, Any], str]:
        data = admission_to_json(admission, admission.admitted_at or time.time())
        data["instance"] = self.instance
        return data, canonical(data)

    def _admit_in(
        self,
        tx: Tx,
        admission: Admission,
        data: dict[str, Any],
        payload: str,
        head: tuple[int, str],
    ) -> Entry:
        """The admission's entry and index rows, written in ``tx`` after ``head`` (locked)."""
        entry = _next_entry(head, admission.tenant, "admitted", admission.execution_id, payload)
        derived = derive(
            admission.tenant, entry.seq, data, entry.prev_hash, "admitted", entry.entry_hash, None
        )
        # The index row first: its primary key is what refuses an id admitted before (one
        # statement for the check and the write; the raise rolls the transaction back).
        if not self._write_row(tx, admission.execution_id, derived.row, insert=True):
            raise InvalidArgument(f"execution {admission.execution_id} was already admitted")
        # Likewise the key's primary key refuses a key taken before; only then is its
        # holder read, to name it.
        if admission.idempotency_key and not tx.execute(
            "INSERT INTO idempotency_keys (tenant, idem_key, execution_id) VALUES (?, ?, ?) "
            "ON CONFLICT (tenant, idem_key) DO NOTHING RETURNING execution_id",
            (admission.tenant, admission.idempotency_key, admission.execution_id),
        ):
            taken = tx.execute(
                "SELECT execution_id FROM idempotency_keys WHERE tenant = ? AND idem_key = ?",
                (admission.tenant, admission.idempotency_key),
            )
            raise KeyTaken(admission.idempotency_key, str(taken[0][0]))
        _sessions.insert_row(tx, admission.tenant, data, self.instance)
        self._write_entry(tx, entry)
        return entry

    def by_key(self, tenant: str, key: str) -> str | None:
        rows = self._db.read_one(
            "SELECT execution_id FROM idempotency_keys WHERE tenant = ? AND idem_key = ?",
            (tenant, key),
        )
        return str(rows[0][0]) if rows else None

    def complete(self, execution_id: str, result: ExecutionResult) -> None:
        data = result_to_json(result)
        data["execution_id"] = execution_id
        payload = canonical(data)
        with self._db.write() as tx:
            # The record's tenant and status and the tenant's chain head in one statement, the
            # head locked (on PostgreSQL ``FOR UPDATE OF`` the head alone, as `_lock_head` does).
            lock = self._db.for_update + " OF h" if self._db.for_update else ""
            rows = tx.execute(
                "SELECT e.tenant, e.status, h.seq, h.head_hash FROM executions e "
                "JOIN chain_heads h ON h.tenant = e.tenant WHERE e.execution_id = ?" + lock,
                (execution_id,),
            )
            if rows:
                tenant, was = str(rows[0][0]), str(rows[0][1])
                head = (int(rows[0][2]), str(rows[0][3]))
                current = self._db.serial_writes
            else:  # not admitted (NotFound), or its tenant's head is missing: made as by appends
                tenant = self._tenant_of(tx, execution_id)
                head = self._lock_head(tx, tenant)
                current = False
            if not current:  # read under the lock: another server may have ended it meanwhile
                was = str(
                    tx.execute(
                        "SELECT status FROM executions WHERE execution_id = ?", (execution_id,)
                    )[0][0]
                )
            if was not in ("running", "interrupted"):
                raise InvalidArgument(f"execution {execution_id} was already completed")
            self._complete_in(tx, (tenant, execution_id), head, data, payload, was)

    def _complete_in(
        self,
        tx: Tx,
        record: tuple[str, str],
        head: tuple[int, str],
        data: dict[str, Any],
        payload: str,
        was: str,
    ) -> Entry:
        """The completion's entry and index rows for ``record`` (tenant, execution id), whose
        status ``was`` running or interrupted, written in ``tx`` after ``head`` (locked)."""
        tenant, execution_id = record
        status, finished_at, calls, violations = ended(data)
        entry = _next_entry(head, tenant, "completed", execution_id, payload)
        self._write_entry(tx, entry)
        # The index as `_reindex` would derive it, without reading the admission entry
        # back: a completion sets the row's status, finish time and last hash, and its
        # calls and violations; the admission fields and the holder (`instance`, which only
        # the admission and take-overs name) stay what the row's last reindex wrote.
        admit_seq = tx.execute(
            "UPDATE executions SET status = ?, finished_at = ?, record_hash = ? "
            "WHERE execution_id = ? RETURNING admit_seq",
            (status, finished_at, entry.entry_hash, execution_id),
        )[0][0]
        # Calls and violations rows exist only after a completion, and a record completes
        # again only when that completion's status was `interrupted` (a session's end).
        self._write_lists(
            tx, tenant, (execution_id, int(admit_seq)), calls, violations, was != "running"
        )
        if data.get("session_id") == execution_id:  # a session's own record: its end
            _sessions.record_end(tx, tenant, execution_id, data)
        return entry

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

    def mark_interrupted(self) -> int:
        return self._mark_interrupted(
            self.instance, "the server stopped before the execution ended"
        )

    # -- fleet membership ----------------------------------------------------------------------

    def heartbeat(self, address: str, ttl_s: float) -> None:
        now = _now_us()
        with self._db.write() as tx:
            tx.execute(
                "INSERT INTO fleet_members (instance, address, seen_at_us, expires_at_us) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (instance) DO UPDATE SET "
                "address = excluded.address, seen_at_us = excluded.seen_at_us, "
                "expires_at_us = excluded.expires_at_us",
                (self.instance, address, now, now + int(ttl_s * 1_000_000)),
            )

    def leave(self) -> None:
        with self._db.write() as tx:
            tx.execute("DELETE FROM fleet_members WHERE instance = ?", (self.instance,))

    def sweep_dead(self) -> list[DeadServer]:
        now = _now_us()
        with self._db.read() as tx:
            expired = tx.execute(
                "SELECT instance FROM fleet_members WHERE expires_at_us < ? AND instance <> ?",
                (now, self.instance),
            )
        dead: list[DeadServer] = []
        for (instance,) in expired:
            # Only the survivor whose DELETE takes the row sweeps it; a server that renewed its
            # lease meanwhile (it was slow, not dead) keeps its row and its records.
            with self._db.write() as tx:
                taken = tx.execute(
                    "DELETE FROM fleet_members WHERE instance = ? AND expires_at_us < ? "
                    "RETURNING address, seen_at_us",
                    (instance, now),
                )
            if not taken:
                continue
            address, seen_at_us = str(taken[0][0]), int(taken[0][1])
            seen = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seen_at_us / 1e6))
            reason = (
                f"the server that held it ({instance} at {address}) stopped responding at {seen}"
            )
            marked = self._mark_interrupted(str(instance), reason)
            dead.append(DeadServer(str(instance), address, seen_at_us / 1e6, marked))
        return dead

    def holder(self, tenant: str, session_id: str) -> Holder | None:
        return _fleet.holder(self._db, tenant, session_id)

    def members(self) -> list[Member]:
        return _fleet.members(self._db, self.instance)

    def fleet_secret(self) -> str:
        return _fleet.fleet_secret(self._db)

    def _mark_interrupted(self, instance: str, why: str) -> int:
        """Marks ``instance``'s running records `interrupted`, each in its own transaction
        under its tenant's chain head (a record completed meanwhile is left as it is)."""
        with self._db.read() as tx:
            running = tx.execute(
                "SELECT execution_id, tenant FROM executions "
                "WHERE status = 'running' AND instance = ? ORDER BY tenant, admit_seq",
                (instance,),
            )
        marked = 0
        reason = canonical({"reason": why, "instance": instance})
        for execution_id, tenant in running:
            with self._db.write() as tx:
                head = self._lock_head(tx, tenant)
                still = tx.execute(
                    "SELECT 1 FROM executions WHERE execution_id = ? AND status = 'running'",
                    (execution_id,),
                )
                if not still:
                    continue
                entry = self._append(tx, tenant, "interrupted", execution_id, reason, head)
                self._reindex(tx, tenant, execution_id, entry, None)
                marked += 1
        return marked

    # -- sessions that move between servers ----------------------------------------------------

    def hand_over(self, execution_id: str, reason: str) -> bool:
        """A draining server lets go of a session it holds: its record becomes `interrupted`
        with ``reason`` and ``handed_over`` (left open, not ended), so that any server may take
        it over (`take_over`). False when the record is not this server's running one."""
        payload = canonical({"reason": reason, "instance": self.instance, "handed_over": True})
        with self._db.write() as tx:
            tenant = self._tenant_of(tx, execution_id)
            head = self._lock_head(tx, tenant)
            still = tx.execute(
                "SELECT 1 FROM executions WHERE execution_id = ? AND status = 'running' "
                "AND instance = ?",
                (execution_id, self.instance),
            )
            if not still:
                return False
            entry = self._append(tx, tenant, "interrupted", execution_id, payload, head)
            self._reindex(tx, tenant, execution_id, entry, None)
        return True

    def take_over(self, tenant: str, execution_id: str) -> str | None:
        """Takes the open record ``execution_id`` (a session) for this server, if its holder
        let go of it: the record is `interrupted` (handed over, swept as dead, or marked by a
        restart), or `running` under a holder whose fleet lease expired. A compare-and-set on
        the record's instance under the tenant's chain lock, so exactly one server takes it;
        the take-over is an entry of the chain (``taken_over``, naming both servers). Returns
        the previous holder, or None when the record is not takeable (ended, unknown, another
        tenant's, or held by a live server)."""
        now = _now_us()
        with self._db.write() as tx:
            head = self._lock_head(tx, tenant)
            rows = tx.execute(
                "SELECT instance, status FROM executions WHERE execution_id = ? AND tenant = ?",
                (execution_id, tenant),
            )
            if not rows:
                return None
            holder, status = str(rows[0][0]), str(rows[0][1])
            if status == "running":
                alive = tx.execute(
                    "SELECT 1 FROM fleet_members WHERE instance = ? AND expires_at_us >= ?",
                    (holder, now),
                )
                if alive or holder == self.instance:
                    return None
            elif status != "interrupted":
                return None
            # The compare-and-set: only while the row still names the holder read above.
            moved = tx.execute(
                "UPDATE executions SET instance = ? WHERE execution_id = ? AND instance = ? "
                "AND status = ? RETURNING execution_id",
                (self.instance, execution_id, holder, status),
            )
            if not moved:
                return None
            tx.execute(
                "UPDATE sessions SET holder = ? WHERE tenant = ? AND session_id = ?",
                (self.instance, tenant, execution_id),
            )
            payload = canonical({"instance": self.instance, "from": holder, "at_us": now})
            entry = self._append(tx, tenant, "taken_over", execution_id, payload, head)
            self._reindex(tx, tenant, execution_id, entry, None)
        return holder

    # -- reads -------------------------------------------------------------------------------

    def _records(self, tx: Tx, tenant: str, ids: Sequence[str]) -> dict[str, AuditRecord]:
        by_id: dict[str, list[tuple[Any, ...]]] = {i: [] for i in ids}
        for start in range(0, len(ids), _BATCH):
            chunk = ids[start : start + _BATCH]
            marks = ", ".join("?" for _ in chunk)
            # Sorted here, not with ORDER BY seq: asked to order by seq, SQLite walked the
            # tenant's whole chain in seq order instead of looking the ids up in the
            # `entries_execution` index (a read cost more the longer the chain).
            for row in tx.execute(
                "SELECT execution_id, kind, payload, prev_hash, entry_hash, seq FROM entries "
                f"WHERE tenant = ? AND execution_id IN ({marks})",
                (tenant, *chunk),
            ):
                by_id[row[0]].append(row)
        records: dict[str, AuditRecord] = {}
        for execution_id, found in by_id.items():
            rows = [row[:5] for row in sorted(found, key=lambda row: int(row[5]))]
            record = _record_from_entries(rows)
            if record is not None:
                records[execution_id] = record
        return records

    def get(self, tenant: str, execution_id: str) -> AuditRecord | None:
        with self._db.read() as tx:
            return self._records(tx, tenant, [execution_id]).get(execution_id)

    def list(self, tenant: str, query: AuditQuery) -> tuple[list[AuditRecord], str | None]:
        size = page_size(query)
        with self._db.read() as tx:
            rows = page(tx, tenant, query)
            shown = rows[:size]
            records = self._records(tx, tenant, [r[0] for r in shown])
        token = f"a{shown[-1][1]}" if len(rows) > size else None
        return [records[r[0]] for r in shown if r[0] in records], token

    def tenants(self) -> builtins.list[str]:
        """Every tenant with a chain or an index row (an operator's view; not in the protocol)."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT tenant FROM chain_heads UNION SELECT tenant FROM executions ORDER BY 1"
            )
        return [str(r[0]) for r in rows]

    def find(self, execution_id: str) -> AuditRecord | None:
        """A record by id whatever its tenant (the operator's `ptc audit show`)."""
        with self._db.read() as tx:
            rows = tx.execute(
                "SELECT DISTINCT tenant FROM entries WHERE execution_id = ?", (execution_id,)
            )
            for (tenant,) in rows:
                record = self._records(tx, str(tenant), [execution_id]).get(execution_id)
                if record is not None:
                    return record
        return None

    # -- verification and retention ----------------------------------------------------------

    def verify(
        self, tenant: str | None = None, since: tuple[int, str] | None = None
    ) -> VerifyReport:
        """Verifies the tenant's chain (every tenant's when None). ``since``: (n, the hash of
        entry n) from a signed checkpoint the caller verified, to start after it instead of
        at the first entry (`sandbox.audit._checking`); only with a tenant."""
        if since is not None and tenant is None:
            raise InvalidArgument("verify since a checkpoint: name the checkpoint's tenant")
        tenants = [tenant] if tenant is not None else self.tenants()
        total, problems = 0, []
        for name in tenants:
            with self._db.read() as tx:
                count, found = verify_in(tx, name, since)
            total += count
            problems += found
        return VerifyReport(tenant=tenant, records=total, problems=problems)

    def prune(self, tenant: str, before: float) -> int:
        """Deletes the tenant's oldest finished records admitted before ``before``.

        Only a prefix of the chain is removed: it ends at the last entry before which every
        execution is finished and old enough. The prefix's last hash becomes the tenant's
        checkpoint (where `verify` starts), and a ``pruned`` entry recording that checkpoint is
        appended to the chain, so pruning is itself part of the tamper-evident record.
        Returns how many records were pruned.
        """
        with self._db.write() as tx:
            self._lock_head(tx, tenant)
            prunable = {
                str(r[0])
                for r in tx.execute(
                    "SELECT execution_id FROM executions "
                    "WHERE tenant = ? AND admitted_at < ? AND status <> 'running'",
                    (tenant, before),
                )
            }
            cut: tuple[int, str] | None = None
            pruned: set[str] = set()
            open_ids: set[str] = set()
            for seq, kind, execution_id, digest in tx.execute(
                "SELECT seq, kind, execution_id, entry_hash FROM entries "
                "WHERE tenant = ? ORDER BY seq",
                (tenant,),
            ):
                if kind != "pruned":
                    if execution_id not in prunable:
                        break
                    if kind == "admitted":
                        open_ids.add(execution_id)
                        pruned.add(execution_id)
                    else:
                        open_ids.discard(execution_id)
                if not open_ids:
                    cut = (int(seq), str(digest))
            if cut is None:
                return 0
            # The pruned entries' hashes stay: they are leaves of the tenant's Merkle tree.
            tx.execute(
                "INSERT INTO pruned_leaves (tenant, seq, entry_hash) "
                "SELECT tenant, seq, entry_hash FROM entries WHERE tenant = ? AND seq <= ? "
                "ON CONFLICT (tenant, seq) DO NOTHING",
                (tenant, cut[0]),
            )
            tx.execute("DELETE FROM entries WHERE tenant = ? AND seq <= ?", (tenant, cut[0]))
            ids = sorted(pruned)
            for start in range(0, len(ids), _BATCH):
                chunk = ids[start : start + _BATCH]
                marks = ", ".join("?" for _ in chunk)
                for table in ("executions", "calls", "violations", "idempotency_keys"):
                    tx.execute(f"DELETE FROM {table} WHERE execution_id IN ({marks})", chunk)
                tx.execute(
                    f"DELETE FROM sessions WHERE tenant = ? AND session_id IN ({marks})",
                    (tenant, *chunk),
                )
            tx.execute(
                "INSERT INTO checkpoints (tenant, seq, entry_hash) VALUES (?, ?, ?) "
                "ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, "
                "entry_hash = excluded.entry_hash",
                (tenant, cut[0], cut[1]),
            )
            payload = canonical(
                {
                    "through_seq": cut[0],
                    "through_hash": cut[1],
                    "records": len(pruned),
                    "before": before,
                }
            )
            self._append(tx, tenant, "pruned", "", payload)
        return len(pruned)

    def chain_hashes(self, tenant: str) -> builtins.list[tuple[int, str]]:
        """(sequence number, entry hash) of every entry of the tenant's chain, pruned ones
        included, in sequence order, read from one snapshot: the leaves of its Merkle tree."""
        with self._db.read() as tx:
            return [
                (int(seq), str(digest))
                for seq, digest in tx.stream(
                    "SELECT seq, entry_hash FROM pruned_leaves WHERE tenant = ? "
                    "UNION ALL SELECT seq, entry_hash FROM entries WHERE tenant = ? ORDER BY 1",
                    (tenant, tenant),
                )
            ]

    def session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The tenant's session row (`sandbox.audit._sessions`), or None."""
        return _sessions.read_row(self._db.read_one(_sessions.SELECT_ROW, (tenant, session_id)))

    # -- incremental checkpoints (`sandbox.audit.publisher`) -----------------------------------

    def heads(self) -> dict[str, int]:
        """Every tenant's last sequence number, in one read."""
        return _frontiers.heads(self._db)

    def hashes_after(self, tenant: str, seq: int) -> builtins.list[tuple[int, str]]:
        """`chain_hashes` after entry ``seq`` only: what was appended since a checkpoint."""
        return _frontiers.hashes_after(self._db, tenant, seq)

    def frontier_at(self, tenant: str, size: int) -> Frontier | None:
        return _frontiers.frontier_at(self._db, tenant, size)

    def save_frontier(self, tenant: str, frontier: Frontier) -> None:
        _frontiers.save_frontier(self._db, tenant, frontier)

    def close(self) -> None:
        self._db.close()


def _next_entry(
    head: tuple[int, str], tenant: str, kind: str, execution_id: str, payload: str
) -> Entry:
    """The entry that follows ``head`` (locked by `_lock_head`), hashed, not yet written."""
    seq, head_hash = head
    at_us = _now_us()
    digest = entry_hash(tenant, seq + 1, kind, execution_id, at_us, payload, head_hash)
    return Entry(tenant, seq + 1, kind, execution_id, at_us, payload, head_hash, digest)


def _record_from_entries(rows: Sequence[tuple[Any, ...]]) -> AuditRecord | None:
    """An `AuditRecord` from an execution's entries in sequence order."""
    if not rows or rows[0][1] != "admitted":
        return None
    data = json.loads(rows[0][2])
    admission = admission_from_json(data)
    result: ExecutionResult | None = None
    status = "running"
    interrupted_reason: str | None = None
    for _, kind, payload, _, _ in rows[1:]:
        if kind == "completed":
            result = result_from_json(json.loads(payload))
            status = str(result.status)
        elif kind == "interrupted" and result is None:
            status = "interrupted"
            why = json.loads(payload)
            interrupted_reason = str(why.get("reason", "")) if isinstance(why, dict) else None
        elif kind == "taken_over" and result is None:
            status, interrupted_reason = "running", None  # another server holds it now
    return AuditRecord(
        admission=admission,
        result=result,
        status=status,
        prev_hash=str(rows[0][3]),
        record_hash=str(rows[-1][4]),
        script_sha256=str(data["script_sha256"]),
        interrupted_reason=interrupted_reason,
    )
