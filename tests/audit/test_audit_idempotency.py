"""Idempotency keys in the audit store, over SQLite and PostgreSQL: a key maps to one execution
per tenant, in the admission's own transaction; a second admission under it admits nothing.

Two stores open on one target stand for two servers sharing it."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox.audit import KeyTaken
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def test_a_key_maps_to_the_first_admission_only(audit_db: AuditDb) -> None:
    server_a, server_b = audit_db.open("a"), audit_db.open("b")
    first = dataclasses.replace(admission("acme"), idempotency_key="k-1")
    server_a.admit(first)
    assert server_b.by_key("acme", "k-1") == first.execution_id
    again = dataclasses.replace(admission("acme"), idempotency_key="k-1")
    with pytest.raises(KeyTaken) as taken:
        server_b.admit(again)
    assert taken.value.execution_id == first.execution_id
    assert taken.value.message == (
        f"idempotency_key: 'k-1' was already admitted as execution {first.execution_id}"
    )
    # nothing of the refused admission was written
    assert server_a.get("acme", again.execution_id) is None
    assert audit_db.raw("SELECT COUNT(*) FROM executions")[0][0] == 1
    # the key is per tenant
    other = dataclasses.replace(admission("globex"), idempotency_key="k-1")
    server_b.admit(other)
    assert server_a.by_key("globex", "k-1") == other.execution_id
    assert server_a.by_key("acme", "k-2") is None
    # the record keeps its key, and the chain with it verifies
    server_a.complete(first.execution_id, result(first.execution_id))
    record = server_b.get("acme", first.execution_id)
    assert record is not None and record.admission.idempotency_key == "k-1"
    assert server_a.verify().ok


def test_racing_admissions_of_one_key_admit_one(audit_db: AuditDb) -> None:
    stores = [audit_db.open(f"s{i}") for i in range(4)]
    attempts = [dataclasses.replace(admission("acme"), idempotency_key="race") for _ in stores]

    def admit(index: int) -> str:
        try:
            stores[index].admit(attempts[index])
        except KeyTaken as exc:
            return f"taken:{exc.execution_id}"
        return "admitted"

    with ThreadPoolExecutor(len(stores)) as pool:
        outcomes = list(pool.map(admit, range(len(stores))))
    assert outcomes.count("admitted") == 1
    winner = attempts[outcomes.index("admitted")].execution_id
    assert sorted(o for o in outcomes if o != "admitted") == [f"taken:{winner}"] * 3
    assert audit_db.raw("SELECT COUNT(*) FROM executions")[0][0] == 1


def test_a_record_without_a_key_hashes_as_before(audit_db: AuditDb) -> None:
    store = audit_db.open()
    plain = admission("acme")
    store.admit(plain)
    payload = audit_db.raw("SELECT payload FROM entries WHERE kind = 'admitted'")[0][0]
    assert "idempotency_key" not in payload
