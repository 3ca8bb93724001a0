"""The SQLite audit store's WAL checkpoints (`sandbox.audit.wal_checkpointer`): run by a thread of
the writer's, not inside the commits the server makes on its event loop; the writer's own
checkpoint stays only as a far backstop; a reader never starts the thread; closing stops it.
A real SQLite file in the test's directory."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from sandbox.audit.sqlite import SQLiteAuditStore
from sandbox.audit.wal_checkpointer import BACKSTOP_PAGES
from tests.audit.audit_support import admission, result


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ptc-audit-checkpoint"}


def _write(store: SQLiteAuditStore, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        a = admission("default")
        store.admit(a)
        store.complete(a.execution_id, result(a.execution_id))
        ids.append(a.execution_id)
    return ids


def test_the_writers_thread_checkpoints_and_commits_do_not(tmp_path: Path) -> None:
    before = _threads()
    path = tmp_path / "audit.db"
    store = SQLiteAuditStore(path)
    checkpointer = store._db.checkpointer  # type: ignore[attr-defined]
    assert checkpointer is not None and not checkpointer.running  # nothing written yet
    # The commits' own checkpoint only far away; the thread's as soon as the log passes 64 KiB.
    conn = store._db._conn  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchall() == [(BACKSTOP_PAGES,)]
    checkpointer.threshold_bytes, checkpointer.interval_s = 64 * 1024, 0.01
    ids = _write(store, 50)
    assert checkpointer.running and len(_threads() - before) == 1
    deadline = time.monotonic() + 30
    while checkpointer.checkpoints == 0 and time.monotonic() < deadline:
        ids += _write(store, 5)
        time.sleep(0.02)
    assert checkpointer.checkpoints >= 1
    assert store.get("default", ids[0]) is not None and store.get("default", ids[-1]) is not None
    store.close()
    assert not checkpointer.running and _threads() == before
    assert not Path(str(path) + "-wal").exists()  # the last connection checkpointed it away
    reread = sqlite3.connect(path)
    try:
        (count,) = reread.execute("SELECT count(*) FROM executions").fetchone()
    finally:
        reread.close()
    assert count == len(ids)  # every record, in the database file itself


def test_a_reader_starts_no_thread(tmp_path: Path) -> None:
    path = tmp_path / "audit.db"
    writer = SQLiteAuditStore(path)
    (execution_id,) = _write(writer, 1)
    writer.close()
    before = _threads()
    reader = SQLiteAuditStore(path)  # as `ptc audit` opens it
    try:
        record = reader.get("default", execution_id)
        assert record is not None and record.status == "ok"
        assert _threads() == before
        assert not reader._db.checkpointer.running  # type: ignore[attr-defined]
    finally:
        reader.close()


def test_a_store_that_never_wrote_never_starts_the_thread(tmp_path: Path) -> None:
    before = _threads()
    store = SQLiteAuditStore(tmp_path / "audit.db")  # its migrations write: not counted
    checkpointer = store._db.checkpointer  # type: ignore[attr-defined]
    assert checkpointer is not None and checkpointer._thread is None
    store.close()
    assert checkpointer._thread is None and _threads() == before
