"""The audit store's contract, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses
import threading
import uuid

import pytest

from sandbox.audit import AuditQuery
from sandbox.audit._codec import OUTPUT_CAP_BYTES, admission_to_json
from sandbox.errors import InvalidArgument, NotFound
from sandbox.result import ExecutionStatus
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def test_admit_then_complete_round_trips(audit_db: AuditDb) -> None:
    store = audit_db.open()
    adm = admission("acme", script="import tools\nprint(tools.search(q='é'))")
    store.admit(adm)
    running = store.get("acme", adm.execution_id)
    assert running is not None
    assert running.status == "running" and running.result is None
    assert running.admission.script == adm.script
    assert running.admission.admitted_at > 0
    assert len(running.script_sha256) == 64

    done = result(adm.execution_id, tools=("search", "fetch"), violations=("wall_time",))
    store.complete(adm.execution_id, done)
    record = store.get("acme", adm.execution_id)
    assert record is not None
    assert record.status == "limit_exceeded" or record.status == "ok"
    assert record.result is not None
    assert record.result.to_json() == done.to_json()
    assert record.prev_hash == running.prev_hash
    assert record.record_hash != running.record_hash
    assert store.verify().ok


def test_tenant_isolation_in_listing_and_fetching(audit_db: AuditDb) -> None:
    store = audit_db.open()
    ours = [admission("acme") for _ in range(3)]
    theirs = [admission("globex") for _ in range(2)]
    for adm in ours + theirs:
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id))
    listed, token = store.list("acme", AuditQuery())
    assert token is None
    assert {r.admission.execution_id for r in listed} == {a.execution_id for a in ours}
    assert all(r.admission.tenant == "acme" for r in listed)
    for adm in theirs:  # a guessed id of another tenant answers as if it did not exist
        assert store.get("acme", adm.execution_id) is None
        assert store.get("globex", adm.execution_id) is not None
    assert store.get("acme", uuid.uuid4().hex) is None
    assert store.list("nobody", AuditQuery()) == ([], None)
    assert store.verify("acme").records == 3
    assert store.verify("globex").records == 2


def test_queries_by_status_tool_violation_time_and_pages(audit_db: AuditDb) -> None:
    store = audit_db.open()
    plan = [
        (ExecutionStatus.OK, ("search",), ()),
        (ExecutionStatus.ERROR, ("fetch",), ()),
        (ExecutionStatus.LIMIT_EXCEEDED, ("search", "fetch"), ("memory",)),
        (ExecutionStatus.LIMIT_EXCEEDED, (), ("wall_time",)),
        (ExecutionStatus.OK, ("write-file",), ()),
    ]
    ids = []
    for i, (status, tools, violations) in enumerate(plan):
        adm = admission("acme", at=1000.0 + i)
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id, status, tools, violations))
        ids.append(adm.execution_id)
    running = admission("acme", at=1010.0)
    store.admit(running)

    def listed(**kw: object) -> list[str]:
        return [r.admission.execution_id for r in store.list("acme", AuditQuery(**kw))[0]]  # type: ignore[arg-type]

    assert listed() == [running.execution_id, *reversed(ids)]  # newest first
    assert listed(status="ok") == [ids[4], ids[0]]
    assert listed(status="running") == [running.execution_id]
    assert listed(tool="fetch") == [ids[2], ids[1]]
    assert listed(tool="write-file") == [ids[4]]
    assert listed(violation="memory") == [ids[2]]
    assert listed(violation="wall_time") == [ids[3]]
    assert listed(since=1001.0, until=1003.0) == [ids[2], ids[1]]
    assert listed(tool="search", status="limit_exceeded") == [ids[2]]

    seen: list[str] = []
    token = None
    while True:
        page, token = store.list("acme", AuditQuery(limit=2, page_token=token))
        assert len(page) <= 2
        seen += [r.admission.execution_id for r in page]
        if token is None:
            break
    assert seen == listed()
    with pytest.raises(InvalidArgument):
        store.list("acme", AuditQuery(page_token="not-a-token"))


def test_mark_interrupted_only_touches_this_instance(audit_db: AuditDb) -> None:
    ours = audit_db.open(instance="server-a")
    sibling = audit_db.open(instance="server-b")
    mine, theirs = admission("acme"), admission("acme")
    ours.admit(mine)
    sibling.admit(theirs)
    finished = admission("acme")
    ours.admit(finished)
    ours.complete(finished.execution_id, result(finished.execution_id))

    restarted = audit_db.open(instance="server-a")
    assert restarted.mark_interrupted() == 1
    assert restarted.mark_interrupted() == 0
    record = restarted.get("acme", mine.execution_id)
    assert record is not None and record.status == "interrupted" and record.result is None
    other = restarted.get("acme", theirs.execution_id)
    assert other is not None and other.status == "running"
    assert [
        r.admission.execution_id
        for r in restarted.list("acme", AuditQuery(status="interrupted"))[0]
    ] == [mine.execution_id]
    assert restarted.verify().ok

    # A late completion (the execution outlived the restart) is still recorded, and chained.
    restarted.complete(mine.execution_id, result(mine.execution_id))
    late = restarted.get("acme", mine.execution_id)
    assert late is not None and late.status == "ok"
    assert restarted.verify().ok


def test_misuse_is_refused(audit_db: AuditDb) -> None:
    store = audit_db.open()
    adm = admission("acme")
    store.admit(adm)
    with pytest.raises(InvalidArgument, match="already admitted"):
        store.admit(adm)
    store.complete(adm.execution_id, result(adm.execution_id))
    with pytest.raises(InvalidArgument, match="already completed"):
        store.complete(adm.execution_id, result(adm.execution_id))
    with pytest.raises(NotFound):
        store.complete("no-such-id", result("no-such-id"))
    assert store.verify().ok


def test_output_is_capped_with_a_marker(audit_db: AuditDb) -> None:
    store = audit_db.open()
    adm = admission("acme")
    store.admit(adm)
    big = "x" * (OUTPUT_CAP_BYTES + 100)
    store.complete(adm.execution_id, result(adm.execution_id, stdout=big))
    record = store.get("acme", adm.execution_id)
    assert record is not None and record.result is not None
    assert record.result.stdout.startswith("x" * 1000)
    assert record.result.stdout.endswith("[audit: 100 bytes dropped]")


def test_concurrent_writers_keep_one_chain(audit_db: AuditDb) -> None:
    """Four store connections append to the same tenant's chain at once."""
    stores = [audit_db.open(instance=f"server-{i}") for i in range(4)]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(15):
                adm = admission("acme")
                stores[index].admit(adm)
                stores[index].complete(adm.execution_id, result(adm.execution_id))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    report = stores[0].verify()
    assert report.ok, report.problems
    assert report.records == 60
    assert audit_db.raw("SELECT MAX(seq), COUNT(*) FROM entries WHERE tenant = 'acme'")[0] == (
        120,
        120,
    )


def test_schema_is_versioned_and_migrated_once(audit_db: AuditDb) -> None:
    from sandbox.audit._schema import MIGRATIONS, SCHEMA_VERSION

    first = audit_db.open()
    assert first.schema_version() == SCHEMA_VERSION
    second = audit_db.open()
    assert second.schema_version() == SCHEMA_VERSION
    assert audit_db.raw("SELECT COUNT(*) FROM schema_version")[0][0] == len(MIGRATIONS)


def test_retention_prunes_a_prefix_and_the_chain_still_verifies(audit_db: AuditDb) -> None:
    store = audit_db.open()
    old = [admission("acme", at=100.0 + i) for i in range(4)]
    for adm in old[:2]:
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id))
    store.admit(old[2])  # still running: pruning must stop before it
    store.admit(old[3])
    store.complete(old[3].execution_id, result(old[3].execution_id))
    new = admission("acme", at=5000.0)
    store.admit(new)
    store.complete(new.execution_id, result(new.execution_id))

    assert store.prune("acme", before=1000.0) == 2
    remaining = {r.admission.execution_id for r in store.list("acme", AuditQuery())[0]}
    assert remaining == {old[2].execution_id, old[3].execution_id, new.execution_id}
    report = store.verify()
    assert report.ok, report.problems

    # old[2] now finishes after `new` was admitted: the prefix can only end after both.
    store.complete(old[2].execution_id, result(old[2].execution_id))
    assert store.prune("acme", before=1000.0) == 0
    assert store.prune("acme", before=10_000.0) == 3
    assert store.list("acme", AuditQuery()) == ([], None)
    assert store.verify().ok
    assert store.prune("acme", before=10_000.0) == 0
    later = admission("acme", at=20_000.0)
    store.admit(later)
    assert store.verify().ok

    # Moving the checkpoint to hide more deletions is detected.
    audit_db.raw("UPDATE checkpoints SET seq = seq + 1 WHERE tenant = 'acme'")
    report = store.verify()
    assert not report.ok
    assert any("checkpoint" in p for p in report.problems)


def test_the_runtime_is_kept_and_absent_for_the_standard_library(audit_db: AuditDb) -> None:
    store = audit_db.open()
    plain = admission("acme")
    numpy = dataclasses.replace(admission("acme"), runtime="np")
    for adm in (plain, numpy):
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id))
    got = [store.get("acme", a.execution_id) for a in (plain, numpy)]
    assert [r.admission.runtime for r in got if r is not None] == ["", "np"]
    # A record of the standard library is written exactly as before runtimes were recorded,
    # so the hashes of records already in a chain do not change meaning.
    assert "runtime" not in admission_to_json(plain, 1.0)
    assert admission_to_json(numpy, 1.0)["runtime"] == "np"
    assert store.verify().ok


def test_prune_keeps_an_execution_that_finished_after_the_cut(audit_db: AuditDb) -> None:
    """Finished and old, but completed after a running one was admitted: its admission is past
    where the prefix can end, so its rows stay with its entries and the chain still verifies."""
    store = audit_db.open()
    done, late, running = (admission("acme", at=100.0 + i) for i in range(3))
    store.admit(done)
    store.complete(done.execution_id, result(done.execution_id))
    store.admit(late)
    store.admit(running)
    store.complete(late.execution_id, result(late.execution_id))

    assert store.prune("acme", before=1000.0) == 1
    remaining = {r.admission.execution_id for r in store.list("acme", AuditQuery())[0]}
    assert remaining == {late.execution_id, running.execution_id}
    report = store.verify()
    assert (report.ok, report.problems) == (True, [])
    store.complete(running.execution_id, result(running.execution_id))
    assert store.prune("acme", before=1000.0) == 2
    assert store.list("acme", AuditQuery()) == ([], None)
    assert store.verify().ok
