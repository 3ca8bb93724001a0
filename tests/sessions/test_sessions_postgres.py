"""Sessions recorded in a PostgreSQL audit store: the session's record, its executions listed
under it, and the chain verified (in a schema of its own, dropped afterwards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.audit import open_store
from sandbox.client import ExecutionQuery

from .conftest import SessionServer


@pytest.mark.requires_postgres
def test_sessions_in_a_postgres_audit_store(tmp_path: Path, pg_url: str) -> None:
    srv = SessionServer(tmp_path, "process", audit_db=pg_url)
    try:
        with srv.a.session() as session:
            one = session.execute("z = 3")
            two = session.execute("z * 2")
        assert two.value == "6"
        listed = srv.a.list_executions(ExecutionQuery(session_id=session.id))
        assert [r.execution_id for r in listed.records] == [
            two.execution_id,
            one.execution_id,
        ]
    finally:
        srv.close()
    store = open_store(pg_url)
    try:
        record = store.get("acme", session.id)
        assert record is not None and record.result is not None
        assert record.admission.labels["ptc.kind"] == "session"
        assert record.result.error is not None
        assert record.result.error.message == "closed: closed by the client"
        assert store.verify("acme").ok
    finally:
        store.close()
