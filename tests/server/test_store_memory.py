"""The in-memory audit store (``ptc serve --audit-db memory``) hashes each admission's JSON as
`dataclasses.asdict` spelled it, without asdict's deep copy; its chain still verifies, and a
changed admission is found."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandbox.audit.base import Admission
from sandbox.expectations import ExpectedCalls
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.server.store_memory import MemoryAuditStore, _admission_json


def _asdict_json(admission: Admission) -> str:
    data = dataclasses.asdict(admission)
    data["effective_limits"] = dict(admission.effective_limits)
    data["labels"] = dict(admission.labels)
    return json.dumps(data, sort_keys=True, default=str)


def _admission(execution_id: str, expected: tuple[ExpectedCalls, ...] | None) -> Admission:
    return Admission(
        execution_id=execution_id,
        tenant="acme",
        script="print(1)\n",
        manifest_json='[{"name": "search"}]',
        manifest_sha256="ab" * 32,
        backend="process",
        policy="none",
        effective_limits={"wall_time_ms": 10000, "memory_bytes": 268435456},
        labels={"team": "search"},
        admitted_at=1.5,
        expected_calls=expected,
        runtime="data",
        idempotency_key="key-1",
    )


EXPECTED = {
    "none": None,
    "empty": (),
    "two": (ExpectedCalls("search", 1, None), ExpectedCalls("fetch", None, 3)),
}


@pytest.mark.parametrize("expected", EXPECTED.values(), ids=EXPECTED.keys())
def test_admission_json_is_the_asdict_text(expected: tuple[ExpectedCalls, ...] | None) -> None:
    admission = _admission("e1", expected)
    assert _admission_json(admission) == _asdict_json(admission)


def test_the_chain_verifies_and_a_changed_admission_is_found() -> None:
    store = MemoryAuditStore()
    for n, expected in enumerate(EXPECTED.values()):
        admission = dataclasses.replace(_admission(f"e{n}", expected), idempotency_key=f"key-{n}")
        store.admit(admission)
        store.complete(
            admission.execution_id,
            ExecutionResult(admission.execution_id, ExecutionStatus.OK, stdout="1\n"),
        )
    report = store.verify("acme")
    assert (report.ok, report.records) == (True, 3), report
    entry = store._entries["e1"]
    entry.admission = dataclasses.replace(entry.admission, script="print(2)\n")
    report = store.verify("acme")
    assert not report.ok
    assert report.problems == ["e1: the admission was altered"]
