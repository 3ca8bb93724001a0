"""`AuditWrites` (the server's write path) over a real SQLite file on a small tmpfs filled by a
real file: a refused admission is `StoreUnavailable` naming SQLite's error and admits nothing; a
refused completion is kept, up to its bound, one more is dropped and counted; nothing is admitted
while completions wait; once space is freed `recover` writes the kept one and clears the failure.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.audit import AuditQuery, open_store
from sandbox.errors import StoreUnavailable
from sandbox.server.audit_writes import AuditWrites
from sandbox.telemetry import metrics
from tests.audit.audit_support import admission, result
from tests.small_fs import fill, small_tmpfs

BIG = "x" * 200_000  # a completion far larger than what a full disk has left


@pytest.fixture
def prometheus() -> Iterator[metrics.Metrics]:
    yield metrics.enable()
    metrics.disable()


def test_refused_completions_are_kept_bounded_and_written_once_space_is_freed(
    tmp_path: Path, prometheus: metrics.Metrics
) -> None:
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        store = open_store(fs / "audit.db", instance="writes-test")
        try:
            writes = AuditWrites(store, max_pending=1)
            kept, dropped, later = (admission("acme") for _ in range(3))
            writes.admit(kept)
            writes.admit(dropped)
            filler = fill(fs)

            with pytest.raises(StoreUnavailable) as refused:
                writes.admit(later)
            assert refused.value.message == (
                f"execution not admitted: audit store {fs / 'audit.db'}: database or disk is full"
            )
            writes.complete(kept.execution_id, result(kept.execution_id, stdout=BIG))
            writes.complete(dropped.execution_id, result(dropped.execution_id, stdout=BIG))
            assert writes.pending == 1
            assert writes.failure == f"audit store {fs / 'audit.db'}: database or disk is full"
            with pytest.raises(StoreUnavailable) as waiting:  # not even tried: one waits
                writes.admit(later)
            assert waiting.value.message == (
                "execution not admitted: the audit store refuses writes (audit store "
                f"{fs / 'audit.db'}: database or disk is full); 1 finished executions wait to "
                "be recorded first"
            )
            assert writes.recover() is False
            sample = prometheus.registry.get_sample_value
            assert sample("ptc_audit_completions_pending") == 1
            assert sample("ptc_audit_completions_dropped_total") == 1
            assert sample("ptc_audit_write_failures_total", {"operation": "admit"}) == 1
            assert sample("ptc_audit_write_failures_total", {"operation": "complete"}) == 2

            filler.unlink()
            assert writes.recover() is True
            assert writes.pending == 0
            assert writes.failure is None, writes.failure
            assert sample("ptc_audit_completions_pending") == 0
            writes.admit(later)
            records, _ = store.list("acme", AuditQuery())
            statuses = {r.admission.execution_id: r.status for r in records}
            assert statuses == {
                kept.execution_id: "ok",
                dropped.execution_id: "running",  # beyond the bound: the next start marks it
                later.execution_id: "running",
            }
            kept_record = store.get("acme", kept.execution_id)
            assert kept_record is not None and kept_record.result is not None
            assert kept_record.result.stdout == BIG
            assert store.verify("acme").ok
        finally:
            store.close()


def test_a_probe_write_clears_a_failure_when_no_completion_waits(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        store = open_store(fs / "audit.db", instance="probe-test")
        try:
            writes = AuditWrites(store)
            filler = fill(fs)
            big = dataclasses.replace(admission("acme"), script=BIG)
            with pytest.raises(StoreUnavailable):
                writes.admit(big)
            assert writes.pending == 0 and writes.failure is not None
            assert writes.recover() is False  # the probe is padded: it does not fit either
            filler.unlink()
            assert writes.recover() is True and writes.failure is None
            assert store.list("acme", AuditQuery())[0] == []  # the probe is not in the chain
            assert store.verify().ok
        finally:
            store.close()


def test_the_pending_gauge_ends_at_zero_when_a_keep_and_a_recover_overlap(
    tmp_path: Path, prometheus: metrics.Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI once saw the gauge stay at 1 after every kept completion was written: an execution's
    thread kept its completion and set the gauge after the lock, and a `recover` on another thread
    had written it and set 0 in between. Here the keeping thread is held where it sets the gauge
    until the recover has run (or half a second, when the recover must wait for it)."""
    real_set = metrics.audit_pending
    keeping, recovered = threading.Event(), threading.Event()

    def held_set(count: int) -> None:
        if count == 1 and not keeping.is_set():
            keeping.set()
            recovered.wait(0.5)
        real_set(count)

    monkeypatch.setattr(metrics, "audit_pending", held_set)
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        store = open_store(fs / "audit.db", instance="race-test")
        try:
            writes = AuditWrites(store)
            ran = admission("acme")
            writes.admit(ran)
            filler = fill(fs)
            keeper = threading.Thread(
                target=writes.complete,
                args=(ran.execution_id, result(ran.execution_id, stdout=BIG)),
            )
            keeper.start()
            assert keeping.wait(10), "the completion was never kept"
            filler.unlink()
            recoveries: list[bool] = []
            recoverer = threading.Thread(target=lambda: recoveries.append(writes.recover()))
            recoverer.start()
            recoverer.join(10)
            recovered.set()
            keeper.join(10)
            recoverer.join(10)
            assert not keeper.is_alive() and not recoverer.is_alive()
            assert recoveries == [True]
            assert writes.pending == 0 and writes.failure is None
            assert prometheus.registry.get_sample_value("ptc_audit_completions_pending") == 0
            record = store.get("acme", ran.execution_id)
            assert record is not None and record.status == "ok"
        finally:
            store.close()
