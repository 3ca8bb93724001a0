"""Writing or reading a record costs the same on a long chain: SQLite's own instruction counts.

Each append locks the chain head and writes one entry and its index rows; nothing on the write
path may walk the chain. Counted as the virtual-machine instructions SQLite runs for a write
(`sqlite3.Connection.set_progress_handler`), which are the same on every run and machine: no
clock is involved. A completion that asked for the latest take-over with ``ORDER BY seq DESC
LIMIT 1`` walked the tenant's whole chain backwards: its count grew by about 5 instructions
per entry (527 on a chain of 40 entries, 15,537 on one of 3,040).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path

from sandbox.audit.sqlite import SQLiteAuditStore, _SQLiteDb
from tests.audit.audit_support import admission, result


def _instructions(store: SQLiteAuditStore, work: Callable[[], object]) -> int:
    db = store._db
    assert isinstance(db, _SQLiteDb)
    conn = db._conn  # white box: the store's one connection
    count = 0

    def step() -> int:
        nonlocal count
        count += 1
        return 0  # go on

    conn.set_progress_handler(step, 1)
    try:
        work()
    finally:
        conn.set_progress_handler(None, 1)
    return count


def _one_execution(store: SQLiteAuditStore) -> tuple[int, int]:
    """Instructions for one admission (with an idempotency key) and its completion."""
    adm = dataclasses.replace(admission("acme"), idempotency_key=uuid.uuid4().hex)
    done = result(adm.execution_id)
    admitted = _instructions(store, lambda: store.admit(adm))
    completed = _instructions(store, lambda: store.complete(adm.execution_id, done))
    return admitted, completed


def test_admitting_and_completing_cost_the_same_on_a_long_chain(tmp_path: Path) -> None:
    store = SQLiteAuditStore(tmp_path / "audit.db")
    try:
        for _ in range(20):
            adm = admission("acme")
            store.admit(adm)
            store.complete(adm.execution_id, result(adm.execution_id))
        short = _one_execution(store)
        for _ in range(1500):  # 3,000 more entries in the tenant's chain
            adm = admission("acme")
            store.admit(adm)
            store.complete(adm.execution_id, result(adm.execution_id))
        long = _one_execution(store)
        # A B-tree one level deeper may cost a few more instructions per look-up, never
        # thousands: 3,000 entries walked cost about 15,000 (about 240 and 270 here, each the
        # same on both chains).
        assert long[0] < short[0] + 200, (short, long)
        assert long[1] < short[1] + 200, (short, long)
    finally:
        store.close()


def test_reading_a_record_costs_the_same_on_a_long_chain(tmp_path: Path) -> None:
    store = SQLiteAuditStore(tmp_path / "audit.db")
    try:
        first = admission("acme")
        store.admit(first)
        store.complete(first.execution_id, result(first.execution_id))
        short = _instructions(store, lambda: store.get("acme", first.execution_id))
        for _ in range(1500):
            adm = admission("acme")
            store.admit(adm)
            store.complete(adm.execution_id, result(adm.execution_id))
        record = store.get("acme", first.execution_id)
        assert record is not None and record.status == "ok"  # still the first one, whole
        long = _instructions(store, lambda: store.get("acme", first.execution_id))
        # Ordered by seq in SQL, the read walked the chain: 39 instructions, then 15,039.
        assert long < short + 200, (short, long)
    finally:
        store.close()
