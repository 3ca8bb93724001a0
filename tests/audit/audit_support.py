"""Builders for admissions and results used by the audit tests."""

from __future__ import annotations

import uuid

from sandbox.audit import Admission
from sandbox.limits import DEFAULTS
from sandbox.result import (
    CallRecord,
    CallStatus,
    Evidence,
    ExecutionResult,
    ExecutionStatus,
    Usage,
    Violation,
)


def admission(
    tenant: str, execution_id: str | None = None, script: str = "print(1)", at: float = 0.0
) -> Admission:
    return Admission(
        execution_id=execution_id or uuid.uuid4().hex,
        tenant=tenant,
        script=script,
        manifest_json='[{"name": "search"}]',
        manifest_sha256="ab" * 32,
        backend="process",
        policy="none",
        effective_limits=DEFAULTS,
        labels={"agent": "test"},
        admitted_at=at,
    )


def result(
    execution_id: str,
    status: ExecutionStatus = ExecutionStatus.OK,
    tools: tuple[str, ...] = ("search",),
    violations: tuple[str, ...] = (),
    stdout: str = "done\n",
) -> ExecutionResult:
    return ExecutionResult(
        execution_id=execution_id,
        status=status,
        exit_code=0 if status == ExecutionStatus.OK else 1,
        stdout=stdout,
        stderr="",
        calls=[
            CallRecord(
                seq=i + 1,
                tool=tool,
                arguments={"q": f"x{i}", "n": i},
                status=CallStatus.OK if i % 2 == 0 else CallStatus.ERROR,
                result={"hits": [i]} if i % 2 == 0 else None,
                error=None if i % 2 == 0 else "boom",
                start_offset_s=0.001 * i,
                duration_s=0.0005,
            )
            for i, tool in enumerate(tools)
        ],
        violations=[
            Violation(v, 1.0, 2.0, "s", "killed", "detail", evidence=Evidence.HOST)
            for v in violations
        ],
        usage=Usage(wall_time_s=0.25, cpu_time_s=0.1, peak_memory_bytes=1 << 20, tool_calls=1),
        backend="process",
        isolation=["userns", "netns"],
        effective_limits=DEFAULTS,
        started_at=1000.0,
        finished_at=1000.25,
    )
