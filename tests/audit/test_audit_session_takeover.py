"""Sessions moving between servers in the audit store (`SessionHolding`), on SQLite and
PostgreSQL: a drain hands a session over, exactly one server takes it over (also when many try
at once), a live holder's session is not taken, an ended one neither, and the chain verifies
with the take-over in it."""

from __future__ import annotations

import dataclasses
import threading
import time

from sandbox.audit import AuditQuery
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def _session(store_tenant: str = "acme") -> object:
    adm = admission(store_tenant)
    return dataclasses.replace(adm, labels={"ptc.kind": "session"})


def test_hand_over_then_one_take_over(audit_db: AuditDb) -> None:
    a, b = audit_db.open("server-a"), audit_db.open("server-b")
    adm = _session()
    a.admit(adm)  # type: ignore[arg-type]
    sid = adm.execution_id  # type: ignore[attr-defined]
    a.heartbeat("127.0.0.1:1", 60)
    b.heartbeat("127.0.0.1:2", 60)
    assert b.take_over("acme", sid) is None  # its holder is alive and has not let go
    assert a.hand_over(sid, "handed over: draining") is True
    assert a.hand_over(sid, "again") is False  # no longer running here
    record = b.get("acme", sid)
    assert record is not None and record.status == "interrupted"
    assert record.interrupted_reason == "handed over: draining"
    assert b.take_over("globex", sid) is None  # another tenant's id: not found
    assert b.take_over("acme", sid) == "server-a"
    assert a.take_over("acme", sid) is None  # taken by a live server: not takeable again
    taken = b.get("acme", sid)
    assert taken is not None and taken.status == "running" and taken.interrupted_reason is None
    assert audit_db.raw("SELECT instance FROM executions WHERE execution_id = ?", (sid,)) == [
        ("server-b",)
    ]
    b.complete(sid, result(sid))
    assert b.take_over("acme", sid) is None  # ended: nothing to take
    report = b.verify()
    assert report.ok, report.problems
    kinds = [r[0] for r in audit_db.raw("SELECT kind FROM entries ORDER BY seq")]
    assert kinds == ["admitted", "interrupted", "taken_over", "completed"]


def test_a_holder_whose_lease_expired_loses_it_and_its_sweep_is_the_new_holders(
    audit_db: AuditDb,
) -> None:
    a, b = audit_db.open("server-a"), audit_db.open("server-b")
    adm = _session()
    a.admit(adm)  # type: ignore[arg-type]
    sid = adm.execution_id  # type: ignore[attr-defined]
    a.heartbeat("127.0.0.1:1", 0.05)
    time.sleep(0.1)  # the lease expired; no sweep yet: the record is still `running`
    assert b.take_over("acme", sid) == "server-a"
    # A sweep of server-a now finds nothing of it to mark: it is server-b's.
    assert [d.interrupted for d in b.sweep_dead()] == [0]
    record = b.get("acme", sid)
    assert record is not None and record.status == "running"
    assert b.verify().ok


def test_exactly_one_of_many_takes_it(audit_db: AuditDb) -> None:
    first = audit_db.open("server-a")
    adm = _session()
    first.admit(adm)  # type: ignore[arg-type]
    sid = adm.execution_id  # type: ignore[attr-defined]
    first.hand_over(sid, "handed over")
    stores = [audit_db.open(f"server-{i}") for i in range(6)]
    for index, store in enumerate(stores):
        store.heartbeat(f"127.0.0.1:{index + 10}", 60)  # all alive: the winner keeps it
    won: list[str | None] = [None] * len(stores)
    barrier = threading.Barrier(len(stores))

    def take(index: int) -> None:
        barrier.wait()
        won[index] = stores[index].take_over("acme", sid)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(w for w in won if w is not None) == ["server-a"]
    assert [w is not None for w in won].count(True) == 1
    assert first.verify().ok
    listed, _ = first.list("acme", AuditQuery())
    assert [r.status for r in listed] == ["running"]
