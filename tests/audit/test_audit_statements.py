"""What one admission and its completion cost the SQL store, in statements, and that the shorter
path still writes exactly the index `verify` derives.

A served execution (the SDK sends an idempotency key) asks for its key, is admitted and completes:
1 + 8 + 6 statements, where it ran 3 + 10 + 12. One of the admission's writes its script's and
manifest's text, stored once per tenant by digest (`sandbox.audit._contents`): an insert that only
notes the latest entry naming a text already there. Counted with SQLite's own trace of the statements
it runs (`sqlite3.Connection.set_trace_callback`), which is the same on every run and machine: no
clock is involved. Before this count was held down, an admission without a key ran 8 statements
and a completion without calls 12 (a key looked up in a transaction of its own and before it was
inserted, the tenant read apart from the status and the chain head, the chain head inserted
before every lock, the admission entry read back and parsed, the calls and violations rows
deleted that no completion had written).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.audit import AuditQuery
from sandbox.audit.sqlite import SQLiteAuditStore, _SQLiteDb
from sandbox.errors import InvalidArgument, NotFound
from sandbox.result import ExecutionStatus
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def _statements(store: SQLiteAuditStore, work: Callable[[], object]) -> list[str]:
    """The first words of each statement SQLite ran for ``work``."""
    db = store._db
    assert isinstance(db, _SQLiteDb)
    conn = db._conn  # white box: the store's one connection
    seen: list[str] = []

    def trace(sql: str) -> None:
        words = sql.split()
        seen.append(" ".join(words[:3] if words[0] in ("INSERT", "DELETE") else words[:2]))

    conn.set_trace_callback(trace)
    try:
        work()
    finally:
        conn.set_trace_callback(None)
    return seen


@pytest.fixture
def store(tmp_path: Path) -> SQLiteAuditStore:
    opened = SQLiteAuditStore(tmp_path / "audit.db")
    first = admission("acme")  # the tenant's chain head exists, as on any server but at first
    opened.admit(first)
    opened.complete(first.execution_id, result(first.execution_id))
    return opened


def test_an_admission_and_its_completion_run_thirteen_statements(
    store: SQLiteAuditStore,
) -> None:
    adm = admission("acme")
    admitted = _statements(store, lambda: store.admit(adm))
    assert admitted == [
        "BEGIN IMMEDIATE",
        "SELECT seq,",  # the chain head, locked
        "INSERT INTO executions",  # refuses an id admitted before
        "INSERT INTO contents",  # the script's and manifest's text, or their latest use
        "INSERT INTO entries",
        "UPDATE chain_heads",
        "COMMIT",
    ]
    done = result(adm.execution_id, tools=())  # print(1): no calls, no violations
    completed = _statements(store, lambda: store.complete(adm.execution_id, done))
    assert completed == [
        "BEGIN IMMEDIATE",
        "SELECT e.tenant,",  # the tenant, the status and the chain head, in one read
        "INSERT INTO entries",
        "UPDATE chain_heads",
        "UPDATE executions",
        "COMMIT",
    ]
    assert store.verify().ok
    store.close()


def test_a_keyed_admission_adds_the_key_and_calls_add_their_rows(
    store: SQLiteAuditStore,
) -> None:
    adm = dataclasses.replace(admission("acme"), idempotency_key=uuid.uuid4().hex)
    admitted = _statements(store, lambda: store.admit(adm))
    assert admitted == [
        "BEGIN IMMEDIATE",
        "SELECT seq,",
        "INSERT INTO executions",
        "INSERT INTO idempotency_keys",  # refuses a key taken before
        "INSERT INTO contents",
        "INSERT INTO entries",
        "UPDATE chain_heads",
        "COMMIT",
    ]
    done = result(adm.execution_id, tools=("search", "fetch"), violations=("wall_time",))
    completed = _statements(store, lambda: store.complete(adm.execution_id, done))
    assert completed == [
        "BEGIN IMMEDIATE",
        "SELECT e.tenant,",
        "INSERT INTO entries",
        "UPDATE chain_heads",
        "UPDATE executions",
        "INSERT INTO calls",
        "INSERT INTO calls",
        "INSERT INTO violations",
        "COMMIT",
    ]
    assert store.verify().ok
    store.close()


def test_asking_for_a_key_runs_one_statement(store: SQLiteAuditStore) -> None:
    """Every served execution first asks whether its key was admitted: one SELECT, which is its
    own snapshot, without a BEGIN and a COMMIT around it."""
    adm = dataclasses.replace(admission("acme"), idempotency_key="k-1")
    store.admit(adm)
    asked: list[str | None] = []
    assert _statements(store, lambda: asked.append(store.by_key("acme", "k-1"))) == [
        "SELECT execution_id"
    ]
    assert asked == [adm.execution_id]
    assert store.by_key("acme", "k-2") is None
    assert store.by_key("other", "k-1") is None
    store.close()


def test_a_tenants_first_entry_creates_its_chain_head(tmp_path: Path) -> None:
    store = SQLiteAuditStore(tmp_path / "audit.db")
    adm = admission("acme")
    admitted = _statements(store, lambda: store.admit(adm))
    assert admitted[:4] == [
        "BEGIN IMMEDIATE",
        "SELECT seq,",  # none yet
        "INSERT INTO chain_heads",
        "SELECT seq,",
    ]
    store.complete(adm.execution_id, result(adm.execution_id))
    assert store.verify().ok
    store.close()


def test_a_refused_admission_or_completion_writes_nothing(audit_db: AuditDb) -> None:
    store = audit_db.open()
    adm = dataclasses.replace(admission("acme"), idempotency_key="k-1")
    store.admit(adm)
    before = audit_db.raw("SELECT seq, head_hash FROM chain_heads WHERE tenant = 'acme'")
    # The same id again, with the same key: the id is what the refusal names.
    with pytest.raises(InvalidArgument, match=f"execution {adm.execution_id} was already admitted"):
        store.admit(adm)
    with pytest.raises(NotFound, match="no admitted execution nope"):
        store.complete("nope", result("nope"))
    store.complete(adm.execution_id, result(adm.execution_id))
    after = audit_db.raw("SELECT seq, head_hash FROM chain_heads WHERE tenant = 'acme'")
    with pytest.raises(
        InvalidArgument, match=f"execution {adm.execution_id} was already completed"
    ):
        store.complete(adm.execution_id, result(adm.execution_id))
    assert audit_db.raw("SELECT seq, head_hash FROM chain_heads WHERE tenant = 'acme'") == after
    assert before[0][0] == 1 and after[0][0] == 2
    assert audit_db.raw("SELECT COUNT(*) FROM executions")[0][0] == 1
    assert store.verify().ok


def test_a_record_completed_as_interrupted_completes_again_with_its_new_rows(
    audit_db: AuditDb,
) -> None:
    """A session's end completes its running execution as `interrupted`; such a record may be
    completed once more (the execution's own end, arriving late), and its calls and violations
    rows are then the second completion's, exactly as `verify` derives them."""
    store = audit_db.open()
    adm = admission("acme")
    store.admit(adm)
    first = result(
        adm.execution_id,
        status=ExecutionStatus.INTERRUPTED,
        tools=("search", "fetch", "search"),
        violations=("wall_time", "memory"),
    )
    store.complete(adm.execution_id, first)
    assert audit_db.raw("SELECT COUNT(*) FROM calls")[0][0] == 3
    store.complete(adm.execution_id, result(adm.execution_id, tools=("fetch",)))
    assert audit_db.raw("SELECT idx, tool FROM calls ORDER BY idx") == [(0, "fetch")]
    assert audit_db.raw("SELECT COUNT(*) FROM violations")[0][0] == 0
    record = store.get("acme", adm.execution_id)
    assert record is not None and record.status == "ok"
    assert [r.admission.execution_id for r in store.list("acme", AuditQuery(tool="fetch"))[0]] == [
        adm.execution_id
    ]
    assert store.list("acme", AuditQuery(tool="search"))[0] == []
    report = store.verify()
    assert report.ok, report.problems


def test_a_completion_keeps_the_holder_a_take_over_named(audit_db: AuditDb) -> None:
    """The completion no longer rederives the row's holder from the chain: it must still be the
    server that took the record over, as `verify` derives it."""
    first = audit_db.open(instance="server-a")
    second = audit_db.open(instance="server-b")
    adm = admission("acme")
    first.admit(adm)
    assert first.hand_over(adm.execution_id, "draining")
    assert second.take_over("acme", adm.execution_id) == "server-a"
    second.complete(adm.execution_id, result(adm.execution_id))
    assert audit_db.raw(
        "SELECT instance, status FROM executions WHERE execution_id = ?", (adm.execution_id,)
    ) == [("server-b", "ok")]
    report = second.verify()
    assert report.ok, report.problems


def test_two_servers_completing_one_record_at_once_complete_it_once(audit_db: AuditDb) -> None:
    """Its status is read under the tenant's chain lock (on PostgreSQL again after taking it):
    of two servers completing the same records at the same moment, one wins each record and the
    other is told it was already completed."""
    stores = [audit_db.open(instance=f"server-{i}") for i in range(2)]
    ids = []
    for _ in range(20):
        adm = admission("acme")
        stores[0].admit(adm)
        ids.append(adm.execution_id)
    outcomes: list[list[str]] = [[], []]
    start = threading.Barrier(2)

    def work(index: int) -> None:
        start.wait()
        for execution_id in ids:
            try:
                stores[index].complete(execution_id, result(execution_id))
                outcomes[index].append("ok")
            except InvalidArgument as exc:
                assert str(exc) == f"execution {execution_id} was already completed"
                outcomes[index].append("refused")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [sorted((a, b)) for a, b in zip(*outcomes, strict=True)] == [["ok", "refused"]] * 20
    assert audit_db.raw("SELECT COUNT(*) FROM entries WHERE kind = 'completed'")[0][0] == 20
    report = stores[0].verify()
    assert report.ok, report.problems
