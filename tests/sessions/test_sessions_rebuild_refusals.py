"""Sessions that cannot be rebuilt say so: a server stops (handing its session over) and a
server started on the same SQLite audit store is asked for the next cell. A cell that was given
input files cannot be replayed (the record keeps their digests, not their bytes), and a cell
cancelled part way cannot be reproduced: the session is `lost` naming the cell and why, on
every later call too, and the record says it."""

from __future__ import annotations

import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.audit import AuditQuery, open_store
from sandbox.audit._codec import canonical
from sandbox.errors import FailedPrecondition

from .conftest import SessionServer


def _restarted(srv: SessionServer, tmp: Path) -> SessionServer:
    srv.close()
    (tmp / "again").mkdir()
    return SessionServer(tmp / "again", "process", audit_db=srv.audit_db)


def test_a_cell_given_input_files_cannot_be_rebuilt(tmp_path: Path) -> None:
    srv = SessionServer(tmp_path, "process")
    session = srv.a.session()
    session.create()
    assert session.execute("x = 1").status == "ok"
    given = session.execute("print(open('data.txt').read())", files={"data.txt": b"abc"})
    assert given.stdout == "abc\n"
    again = _restarted(srv, tmp_path)
    try:
        expected = (
            f"session_lost: session {session.id!r} is lost: could not be rebuilt on "
            f"{_instance(srv)}: cell 2 (execution id {given.execution_id}) was given input files "
            "('data.txt'); the audit record keeps their names, sizes and hashes, not their bytes"
        )
        for _ in range(2):  # the rebuild is tried once; later calls get the same reason
            with pytest.raises(FailedPrecondition) as lost:
                again.a.run("print(x)", session_id=session.id)
            assert str(lost.value) == expected
        again.assert_healthy()
    finally:
        again.close()
    store = open_store(srv.audit_db)
    try:
        record = store.get("acme", session.id)
        assert record is not None and record.result is not None and record.result.error
        assert record.result.error.message == expected.split("is lost: ", 1)[1].join(("lost: ", ""))
        assert store.verify().ok
    finally:
        store.close()


def test_a_cell_cancelled_part_way_cannot_be_rebuilt(tmp_path: Path) -> None:
    srv = SessionServer(tmp_path, "process")
    session = srv.a.session()
    session.create()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(
            session.execute, "import time\nprint('started', flush=True)\ntime.sleep(60)"
        )
        deadline = time.monotonic() + 30
        while not _admitted_cells(srv, session.id) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the cell is admitted (recorded `running`)
        time.sleep(0.5)  # it runs: the drain's grace ends before it does
        srv.call(srv.server.stop(grace_s=0.5))
        cut = slow.result(30)
    for client in (srv.a, srv.b, srv.nosess):
        client.close()
    srv.loop.call_soon_threadsafe(srv.loop.stop)
    srv._thread.join(10)
    srv.loop.close()
    (tmp_path / "again").mkdir()
    again = SessionServer(tmp_path / "again", "process", audit_db=srv.audit_db)
    try:
        assert cut.status == "interrupted"
        with pytest.raises(FailedPrecondition) as lost:
            again.a.run("print(1)", session_id=session.id)
        assert str(lost.value) == (
            f"session_lost: session {session.id!r} is lost: could not be rebuilt on "
            f"{_instance(srv)}: cell 1 (execution id {cut.execution_id}) was interrupted part "
            "way when recorded: how far it got, and so the session's state after it, cannot be "
            "reproduced"
        )
    finally:
        again.close()


def _admitted_cells(srv: SessionServer, session_id: str) -> int:
    records, _ = srv.server.runner.store.list("acme", AuditQuery(session_id=session_id))
    return sum(1 for r in records if r.status == "running")


def _instance(srv: SessionServer) -> str:
    return str(srv.server.runner.store.store.instance)  # type: ignore[attr-defined]


def test_a_session_whose_record_keeps_limits_in_an_older_format_is_not_rebuilt(
    tmp_path: Path,
) -> None:
    srv = SessionServer(tmp_path, "process")
    session = srv.a.session()
    session.create()
    assert session.execute("x = 1").status == "ok"
    srv.close()
    # The session's admission as written before every limit was recorded by field: limit names
    # in seconds (white box: the store's rows; the edited entry no longer verifies).
    with sqlite3.connect(srv.audit_db) as conn:
        where = "execution_id = ? AND kind = 'admitted'"
        (text,) = conn.execute(
            f"SELECT payload FROM entries WHERE {where}", (session.id,)
        ).fetchone()
        payload = json.loads(text)
        payload["effective_limits"] = {"wall_time": 10.0, "memory": 268435456.0}
        conn.execute(
            f"UPDATE entries SET payload = ? WHERE {where}", (canonical(payload), session.id)
        )
    (tmp_path / "again").mkdir()
    again = SessionServer(tmp_path / "again", "process", audit_db=srv.audit_db)
    try:
        with pytest.raises(FailedPrecondition) as lost:
            again.a.run("print(x)", session_id=session.id)
        assert str(lost.value) == (
            f"session_lost: session {session.id!r} could not be rebuilt on {_instance(again)} "
            f"now: session {session.id}: its record keeps its limits in an older format"
        )
        again.assert_healthy()
    finally:
        again.close()
