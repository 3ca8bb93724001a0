# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""The records role of the SQL audit store: admissions, completions and the queries that read them.

An admission and a completion are each one append (`sandbox.audit._chain`) with its index rows;
`get`, `list` and `find` read records back from their entries, found through the indexes
(`sandbox.audit._listing` pages a list), so each read costs its answer, not the history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from sandbox.audit import _contents, _sessions
from sandbox.audit._chain import BATCH, Chain, next_entry
from sandbox.audit._codec import (
    Entry,
    admission_from_json,
    admission_to_json,
    canonical,
    result_to_json,
)
from sandbox.audit._db import Tx
from sandbox.audit._index import derive, ended
from sandbox.audit._listing import page, page_size
from sandbox.audit.base import Admission, AuditQuery, AuditRecord, KeyTaken
from sandbox.errors import InvalidArgument
from sandbox.result import ExecutionResult

__all__ = ["Records"]


class Records(Chain):
    """Admitting, completing and reading records."""

    def admit(self, admission: Admission) -> None:
        data, payload = self._admission_payload(admission)
        with self._db.write() as tx:
            # The tenant's chain head is locked first (FOR UPDATE on PostgreSQL; SQLite's write
            # transaction is already exclusive), so two servers admitting the same key
            # serialise here and the second one sees the first one's row.
            self._admit_in(tx, admission, data, payload, self._lock_head(tx, admission.tenant))

    @cached_property
    def _content(self) -> _contents.Contents:
        return _contents.Contents()

    def _admission_payload(self, admission: Admission) -> tuple[dict[str, Any], str]:
        """(the admission's full JSON, its entry's payload: the script and manifest by digest)."""
        data = admission_to_json(admission, admission.admitted_at or time.time())
        data["instance"] = self.instance
        return data, canonical(_contents.stored_form(data))

    def _admit_in(
        self,
        tx: Tx,
        admission: Admission,
        data: dict[str, Any],
        payload: str,
        head: tuple[int, str],
    ) -> Entry:
        """The admission's entry and index rows, written in ``tx`` after ``head`` (locked)."""
        entry = next_entry(head, admission.tenant, "admitted", admission.execution_id, payload)
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
        self._content.put(tx, admission.tenant, entry.seq, _contents.texts(data))
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
            lock = self._db.engine.for_update + " OF h" if self._db.engine.for_update else ""
            rows = tx.execute(
                "SELECT e.tenant, e.status, h.seq, h.head_hash FROM executions e "
                "JOIN chain_heads h ON h.tenant = e.tenant WHERE e.execution_id = ?" + lock,
                (execution_id,),
            )
            if rows:
                tenant, was = str(rows[0][0]), str(rows[0][1])
                head = (int(rows[0][2]), str(rows[0][3]))
                current = self._db.engine.serial_writes
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
        entry = next_entry(head, tenant, "completed", execution_id, payload)
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

    def _records(self, tx: Tx, tenant: str, ids: Sequence[str]) -> dict[str, AuditRecord]:
        by_id: dict[str, list[tuple[Any, ...]]] = {i: [] for i in ids}
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
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
        ordered = {
            execution_id: [row[:5] for row in sorted(found, key=lambda row: int(row[5]))]
            for execution_id, found in by_id.items()
        }
        admissions = {
            execution_id: json.loads(rows[0][2])
            for execution_id, rows in ordered.items()
            if rows and rows[0][1] == "admitted"
        }
        self._content.expand(tx, tenant, list(admissions.values()))
        records: dict[str, AuditRecord] = {}
        for execution_id, data in admissions.items():
            records[execution_id] = _record_from_entries(data, ordered[execution_id])
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


def _record_from_entries(data: dict[str, Any], rows: Sequence[tuple[Any, ...]]) -> AuditRecord:
    """An `AuditRecord` from an execution's entries in sequence order, the first its admission
    (``data``: its payload, with the text it names by digest put back)."""
    admission = admission_from_json(data)
    result: ExecutionResult | None = None
    status = "running"
    interrupted_reason: str | None = None
    for _, kind, payload, _, _ in rows[1:]:
        if kind == "completed":
            result = ExecutionResult.from_json(json.loads(payload))
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
