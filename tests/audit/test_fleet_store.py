"""The store's answers about the fleet, over a real SQLite file and PostgreSQL: which server holds
an open session, where it listens and whether its lease is alive; the live members; the fleet's
secret, created once and the same for every server sharing the store."""

from __future__ import annotations

from sandbox.audit.base import Holder, Member
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def test_the_holder_of_an_open_session(audit_db: AuditDb) -> None:
    a, b = audit_db.open("srv-a"), audit_db.open("srv-b")
    a.heartbeat("10.0.0.1:50051", 60)
    a.admit(admission("acme", "s-1"))
    assert b.holder("acme", "s-1") == Holder("srv-a", "10.0.0.1:50051", True)
    assert b.holder("globex", "s-1") is None  # another tenant's id: nothing
    assert b.holder("acme", "s-unknown") is None
    a.complete("s-1", result("s-1"))
    assert b.holder("acme", "s-1") is None  # ended: no one holds it


def test_a_holder_whose_lease_expired_is_not_alive(audit_db: AuditDb) -> None:
    a, b = audit_db.open("srv-a"), audit_db.open("srv-b")
    a.heartbeat("10.0.0.1:50051", 60)
    a.admit(admission("acme", "s-2"))
    audit_db.raw("UPDATE fleet_members SET expires_at_us = 1 WHERE instance = 'srv-a'")
    assert b.holder("acme", "s-2") == Holder("srv-a", "10.0.0.1:50051", False)
    assert b.members() == []
    a.leave()
    assert b.holder("acme", "s-2") is None  # left the fleet: gone


def test_members_are_the_other_live_servers(audit_db: AuditDb) -> None:
    a, b, c = audit_db.open("srv-a"), audit_db.open("srv-b"), audit_db.open("srv-c")
    for store, address in ((a, "a:1"), (b, "b:1"), (c, "c:1")):
        store.heartbeat(address, 60)
    assert a.members() == [Member("srv-b", "b:1", True), Member("srv-c", "c:1", True)]


def test_the_fleet_secret_is_created_once_and_shared(audit_db: AuditDb) -> None:
    a, b = audit_db.open("srv-a"), audit_db.open("srv-b")
    first = a.fleet_secret()
    assert len(first) >= 40
    assert b.fleet_secret() == first == a.fleet_secret()
    assert audit_db.raw("SELECT COUNT(*) FROM fleet_secret") == [(1,)]
