"""The audit record keeps each violation's evidence and an absent `observed`; records written
before violations carried their evidence still load (as `unspecified`) and verify."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.result import Evidence, ExecutionStatus, Violation
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def test_evidence_and_absent_observed_round_trip(audit_db: AuditDb) -> None:
    store = audit_db.open()
    adm = admission("acme")
    store.admit(adm)
    done = result(adm.execution_id, ExecutionStatus.LIMIT_EXCEEDED)
    done.violations = [
        Violation("memory", 1024.0, 1024.0, "bytes", "killed", evidence=Evidence.KERNEL),
        Violation("stdout_bytes", 10.0, 12.0, "bytes", "truncated", evidence=Evidence.HOST),
        Violation("open_files", 32.0, None, "count", "refused", evidence=Evidence.GUEST),
    ]
    store.complete(adm.execution_id, done)
    record = store.get("acme", adm.execution_id)
    assert record is not None and record.result is not None
    assert [(v.limit, v.observed, v.evidence) for v in record.result.violations] == [
        ("memory", 1024.0, "kernel"),
        ("stdout_bytes", 12.0, "host"),
        ("open_files", None, "guest"),
    ]
    assert record.result.to_json() == done.to_json()
    assert store.verify().ok


def test_a_record_from_before_evidence_loads_and_verifies(
    audit_db: AuditDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = audit_db.open()
    adm = admission("acme")
    store.admit(adm)
    done = result(adm.execution_id, ExecutionStatus.LIMIT_EXCEEDED, violations=("wall_time",))
    new_json = Violation.to_json

    def old_json(self: Violation) -> dict[str, Any]:
        # Exactly what the audit store wrote before the field existed.
        data = new_json(self)
        del data["evidence"]
        return data

    monkeypatch.setattr(Violation, "to_json", old_json)
    store.complete(adm.execution_id, done)
    monkeypatch.undo()
    stored = audit_db.raw(
        "SELECT payload FROM entries WHERE execution_id = ? AND kind = 'completed'",
        (adm.execution_id,),
    )
    assert '"evidence"' not in stored[0][0]
    reopened = audit_db.open()
    record = reopened.get("acme", adm.execution_id)
    assert record is not None and record.result is not None
    assert [(v.limit, v.evidence) for v in record.result.violations] == [
        ("wall_time", "unspecified")
    ]
    assert reopened.verify().ok
