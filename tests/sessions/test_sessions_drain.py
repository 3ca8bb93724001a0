"""A stopping server ends its sessions with a recorded reason; `ptc audit verify` passes over the
records of sessions and their executions, and the session record says how it ended."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandbox.audit import open_store
from sandbox.client import RetryPolicy
from sandbox.errors import NotFound, Unavailable
from sandbox.server.fleet import DRAINING_MESSAGE

from .conftest import SessionServer

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
AUDIT_LIST = [PYTHON, "-m", "sandbox.cli", "audit", "list", "--db"]


@pytest.mark.parametrize(
    "backend", ["process", pytest.param("docker", marks=pytest.mark.requires_docker)]
)
def test_server_stop_hands_sessions_over_with_a_reason(tmp_path: Path, backend: str) -> None:
    """A stopping server hands its sessions over: the session record stays open (not ended),
    `interrupted` with the reason, for the next server to rebuild."""
    srv = SessionServer(tmp_path, backend)
    stopped = False
    try:
        session = srv.a.session(backend=backend)
        session.create()
        done = session.execute("x = 1\nx")
        assert (done.status, done.value) == ("ok", "1")
        srv.call(srv.server.stop(grace_s=1.0))
        stopped = True
        assert srv.open_sessions() == 0
        with pytest.raises(Unavailable):
            session.execute("x")
    finally:
        if not stopped:
            srv.call(srv.server.stop(grace_s=1.0))
        for client in (srv.a, srv.b, srv.nosess):
            client.close()
        srv.loop.call_soon_threadsafe(srv.loop.stop)
        srv._thread.join(10)
        srv.loop.close()
    store = open_store(srv.audit_db)
    try:
        record = store.get("acme", session.id)
        assert record is not None and record.result is None
        assert record.status == "interrupted"
        assert record.interrupted_reason == "handed over: the server that held it was draining"
        execution = store.get("acme", done.execution_id)
        assert execution is not None and execution.admission.labels["ptc.session_id"] == session.id
    finally:
        store.close()
    verify = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", srv.audit_db],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stderr
    listed = subprocess.run(
        [*AUDIT_LIST, srv.audit_db, "--json", "--session", session.id],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["execution_id"] for line in listed.stdout.splitlines()] == [
        done.execution_id
    ]


def _stop_loop(srv: SessionServer) -> None:
    for client in (srv.a, srv.b, srv.nosess):
        client.close()
    srv.loop.call_soon_threadsafe(srv.loop.stop)
    srv._thread.join(10)
    srv.loop.close()


@pytest.mark.parametrize(
    "backend", ["process", pytest.param("docker", marks=pytest.mark.requires_docker)]
)
def test_a_draining_server_hands_its_session_to_the_next_server(
    tmp_path: Path, backend: str
) -> None:
    """While a server drains, a session's next cell is refused with UNAVAILABLE (retry
    elsewhere: the drain hands the session over); a server started on the same audit store
    rebuilds the session from its record on its next cell, with its state; another tenant and
    an id never issued still learn nothing."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    srv = SessionServer(tmp_path / "one", backend)
    try:
        session = srv.a.session(backend=backend)
        session.create()
        assert session.execute("x = 1\nx").value == "1"
        pool = ThreadPoolExecutor(1)
        slow = pool.submit(
            srv.a.execute, "import time\ntime.sleep(2)\nprint('done')", backend=backend
        )
        deadline = time.monotonic() + 30
        while not srv.server.runner._runs and time.monotonic() < deadline:
            time.sleep(0.02)
        stopping = asyncio.run_coroutine_threadsafe(srv.server.stop(grace_s=10.0), srv.loop)
        while srv.server.runner.refusing is None and time.monotonic() < deadline:
            time.sleep(0.01)
        # Asked once: the SDK would ask again on UNAVAILABLE, past this 2 s drain.
        srv.a.retry = RetryPolicy(attempts=1)
        with pytest.raises(Unavailable) as draining:
            session.execute("x")
        assert str(draining.value) == DRAINING_MESSAGE
        # The in-flight execution finishes within the grace.
        assert slow.result(30).stdout == "done\n"
        pool.shutdown()
        stopping.result(30)
    finally:
        if srv.server.runner.refusing is None:
            srv.call(srv.server.stop(grace_s=1.0))
        _stop_loop(srv)

    again = SessionServer(tmp_path / "two", backend, audit_db=srv.audit_db)
    try:
        rebuilt = again.a.run("x + 1", backend=backend, session_id=session.id)
        assert (rebuilt.status, rebuilt.value, rebuilt.session_id) == ("ok", "2", session.id)
        info = again.a.session(session_id=session.id).get()
        assert len(info.execution_ids) == 2  # the session's count continues
        with pytest.raises(NotFound) as foreign:  # another tenant learns nothing of it
            again.b.run("x", backend=backend, session_id=session.id)
        assert str(foreign.value) == f"session_id: no session {session.id!r}"
        with pytest.raises(NotFound) as never:
            again.a.run("x", backend=backend, session_id="s-0000")
        assert str(never.value) == "session_id: no session 's-0000'"
        again.assert_healthy()
    finally:
        again.close()


def test_a_cell_after_the_hand_over_is_sent_elsewhere(tmp_path: Path) -> None:
    """Between the drain's hand-over and the listener's close, a session's cell on the draining
    server is UNAVAILABLE (retry elsewhere), not NOT_FOUND: the session lives on, elsewhere."""
    srv = SessionServer(tmp_path, "process")
    try:
        session = srv.a.session()
        session.create()
        assert session.execute("x = 1").status == "ok"
        srv.call(srv.server.runner.sessions.release_all("unused: the store holds sessions"))
        with pytest.raises(Unavailable) as elsewhere:
            session.execute("x")
        assert str(elsewhere.value) == (
            f"sessions: this server is stopping and handed session {session.id!r} over; retry "
            "on another server, which rebuilds it"
        )
    finally:
        srv.close()
