"""The in-memory audit store (``ptc serve --audit-db memory``) hashes each admission's JSON as
`dataclasses.asdict` spelled it, without asdict's deep copy; its chain still verifies, and a
changed admission is found."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandbox.audit.base import Admission
from sandbox.expectations import ExpectedCalls
from sandbox.older_limits import limits_json
from sandbox.server.store_memory import MemoryAuditStore, _admission_json
from tests.audit.audit_support import admission, result


def _asdict_json(record: Admission) -> str:
    data = dataclasses.asdict(record)
    data["effective_limits"] = limits_json(record.effective_limits)
    data["labels"] = dict(record.labels)
    return json.dumps(data, sort_keys=True, default=str)


def _admission(execution_id: str, expected: tuple[ExpectedCalls, ...] | None) -> Admission:
    # Every field set, the replay's and the key's too: all of them are hashed.
    return dataclasses.replace(
        admission("acme", execution_id, at=1.5),
        expected_calls=expected,
        runtime="data",
        idempotency_key=f"key-{execution_id}",
    )


EXPECTED = {
    "none": None,
    "empty": (),
    "two": (ExpectedCalls("search", 1, None), ExpectedCalls("fetch", None, 3)),
}


@pytest.mark.parametrize("expected", EXPECTED.values(), ids=EXPECTED.keys())
def test_admission_json_is_the_asdict_text(expected: tuple[ExpectedCalls, ...] | None) -> None:
    admitted = _admission("e1", expected)
    assert _admission_json(admitted) == _asdict_json(admitted)


def test_the_chain_verifies_and_a_changed_admission_is_found() -> None:
    store = MemoryAuditStore()
    for n, expected in enumerate(EXPECTED.values()):
        admitted = _admission(f"e{n}", expected)
        store.admit(admitted)
        store.complete(admitted.execution_id, result(admitted.execution_id))
    report = store.verify("acme")
    assert (report.ok, report.records) == (True, 3), report
    entry = store._entries["e1"]
    entry.admission = dataclasses.replace(entry.admission, script="print(2)\n")
    report = store.verify("acme")
    assert not report.ok
    assert report.problems == ["e1: the admission was altered"]
