"""A stopping server ends its sessions with a recorded reason; `ptc audit verify` passes over the
records of sessions and their executions, and the session record says how it ended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.audit import open_store
from sandbox.errors import Unavailable

from .conftest import SessionServer

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
AUDIT_LIST = [PYTHON, "-m", "sandbox.cli", "audit", "list", "--db"]


@pytest.mark.parametrize(
    "backend", ["process", pytest.param("docker", marks=pytest.mark.requires_docker)]
)
def test_server_stop_ends_sessions_with_a_reason(tmp_path: Path, backend: str) -> None:
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
        assert record is not None and record.result is not None
        assert record.status == "interrupted"
        assert record.result.error is not None
        assert record.result.error.message == (
            "closed: server stopping: sessions end with the server"
        )
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
