"""Sessions as typed rows (`sandbox.audit._sessions`) over a real SQLite file and PostgreSQL: the
row follows the session record's entries (admission, take-over, completion), says how the
session ended in typed columns, and goes with the record when retention prunes it."""

from __future__ import annotations

from dataclasses import replace

from sandbox.audit import SqlAuditStore
from sandbox.audit._codec import result_to_json
from sandbox.result import (
    ExecutionResult,
    ExecutionStatus,
    ScriptError,
    SessionEnd,
    SessionEndState,
)
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb

SETTINGS = {
    "ptc.kind": "session",
    "ptc.idle_timeout_ms": "60000",
    "ptc.max_lifetime_ms": "3600000",
    "ptc.max_executions": "7",
}


def _open_session(store: SqlAuditStore, session_id: str, at: float = 1000.0) -> None:
    store.admit(replace(admission("acme", session_id, script="", at=at), labels=SETTINGS))


def _end(store: SqlAuditStore, session_id: str, how: str, at: float = 2000.0) -> None:
    """A session record completed as before its end was typed: in its error's message alone."""
    ended = replace(
        result(session_id, tools=()),
        error=ScriptError("SessionEnded", how),
        session_id=session_id,
        finished_at=at,
    )
    store.complete(session_id, ended)


def test_a_session_row_follows_its_record(audit_db: AuditDb) -> None:
    a = audit_db.open("srv-a")
    b = audit_db.open("srv-b")
    _open_session(a, "s-00aa")
    cell = replace(admission("acme", "cell-1"), labels={"ptc.session_id": "s-00aa"})
    a.admit(cell)
    a.complete("cell-1", result("cell-1"))
    row = b.session("acme", "s-00aa")
    assert row is not None
    assert (row.state, row.end_reason, row.holder, row.ended_at) == ("active", "", "srv-a", None)
    assert (row.idle_timeout_ms, row.max_lifetime_ms, row.max_executions) == (60000, 3600000, 7)
    assert (row.backend, row.created_at, row.ended) == ("process", 1000.0, False)
    assert b.session("globex", "s-00aa") is None  # another tenant's id
    assert b.session("acme", "cell-1") is None  # a cell is no session
    assert a.hand_over("s-00aa", "draining")
    assert b.take_over("acme", "s-00aa") == "srv-a"
    assert b.session("acme", "s-00aa").holder == "srv-b"  # type: ignore[union-attr]
    _end(b, "s-00aa", "closed: closed by the client")
    row = a.session("acme", "s-00aa")
    assert row is not None
    assert (row.state, row.end_reason, row.ended_at) == ("closed", "closed by the client", 2000.0)
    _open_session(a, "s-00bb")
    _end(a, "s-00bb", "lost: the sandbox was killed: memory limit 268435456 bytes")
    lost = a.session("acme", "s-00bb")
    assert lost is not None
    assert (lost.state, lost.end_reason) == (
        "lost",
        "the sandbox was killed: memory limit 268435456 bytes",
    )
    assert a.verify().ok


def test_retention_prunes_the_row_with_the_record(audit_db: AuditDb) -> None:
    store = audit_db.open()
    _open_session(store, "s-0001", at=100.0)
    _end(store, "s-0001", "expired: idle: no execution for 60 s", at=200.0)
    _open_session(store, "s-0002", at=5000.0)
    assert store.session("acme", "s-0001").state == "expired"  # type: ignore[union-attr]
    assert store.prune("acme", before=1000.0) == 1
    assert store.session("acme", "s-0001") is None
    assert store.session("acme", "s-0002") is not None
    assert store.verify().ok


def test_a_status_other_than_a_session_end_is_lost_with_its_message(audit_db: AuditDb) -> None:
    store = audit_db.open()
    _open_session(store, "s-0003")
    ended = replace(
        result("s-0003", status=ExecutionStatus.ERROR, tools=()),
        error=ScriptError("SessionEnded", "the service failed"),
        session_id="s-0003",
    )
    store.complete("s-0003", ended)
    row = store.session("acme", "s-0003")
    assert row is not None and (row.state, row.end_reason) == ("lost", "the service failed")


def test_verify_compares_each_session_row_with_the_chain(audit_db: AuditDb) -> None:
    store = audit_db.open()
    _open_session(store, "s-0004")
    _end(store, "s-0004", "lost: the sandbox was killed")
    _open_session(store, "s-0005")
    assert store.verify().ok
    audit_db.raw(
        "UPDATE sessions SET state = 'closed', end_reason = 'fine' WHERE session_id = ?",
        ("s-0004",),
    )
    audit_db.raw("DELETE FROM sessions WHERE session_id = ?", ("s-0005",))
    audit_db.raw(
        "INSERT INTO sessions SELECT tenant, 's-0bad', state, end_reason, holder, backend, "
        "runtime, created_at, ended_at, idle_timeout_ms, max_lifetime_ms, max_executions "
        "FROM sessions WHERE session_id = 's-0004'"
    )
    assert store.verify().problems == [
        "session s-0004: sessions index differs from the chain in state, end_reason: edited",
        "session s-0005: missing from the sessions index: deleted",
        "session s-0bad: in the sessions index but not in the chain: inserted, or its entries "
        "were deleted",
    ]


def test_the_row_takes_the_typed_end_not_the_message(audit_db: AuditDb) -> None:
    """A session record's completion carries its end as a typed field (`SessionEnd`), which
    the row takes as it is: a reason with ": " in it, or an error message that says something
    else, changes nothing. It survives the record's JSON both ways."""
    store = audit_db.open()
    _open_session(store, "s-0006")
    reason = "cell 3 (execution id e-3): lifetime: reached its maximum lifetime of 60 s"
    end = SessionEnd(SessionEndState.EXPIRED, reason)
    ended = replace(
        result("s-0006", tools=()),
        error=ScriptError("SessionEnded", "not the state: nor the reason"),
        session_id="s-0006",
        session_end=end,
        finished_at=3000.0,
    )
    assert ExecutionResult.from_json(result_to_json(ended)).session_end == end
    store.complete("s-0006", ended)
    row = store.session("acme", "s-0006")
    assert row is not None
    assert (row.state, row.end_reason, row.ended_at) == ("expired", reason, 3000.0)
    record = store.get("acme", "s-0006")
    assert record is not None and record.result is not None
    assert record.result.session_end == end
    assert store.verify().ok
    # A cell's result has no end of its own: its JSON keeps the shape it had.
    cell = replace(result("c-1"), session_id="s-0006")
    assert "session_end" not in result_to_json(cell)
    assert ExecutionResult.from_json(result_to_json(cell)).session_end is None
