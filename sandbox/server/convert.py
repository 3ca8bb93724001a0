"""Protobuf <-> the engine's dataclasses, in both directions, for the server and the client.

Every field of a request is checked here on the way in, and a bad one raises `InvalidArgument`
whose message starts with the field's path (``limits.memory_bytes: ...``,
``expected_calls[1].tool: ...``), which the error interceptor sends as INVALID_ARGUMENT. JSON
values travel as JSON text (see the proto's conventions); times become the proto's unit-named
integer fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import AuditQuery, AuditRecord
from sandbox.engine import ExecutionRequest
from sandbox.errors import InvalidArgument
from sandbox.expectations import ExpectedCalls
from sandbox.limits import LIMIT_SPECS, SPEC_BY_NAME, LimitAdjustment, Limits, ResolvedLimits
from sandbox.result import (
    CallRecord,
    CallStatus,
    ExecutionResult,
    ExecutionStatus,
    ScriptError,
    Usage,
    Violation,
)

__all__ = [
    "limits_from_proto",
    "limits_to_proto",
    "query_from_proto",
    "record_to_proto",
    "request_from_proto",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
]

MAX_LABELS = 64
MAX_LABEL_KEY = 128
MAX_LABEL_VALUE = 1024
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50

_BACKENDS = {pb.BACKEND_PROCESS: "process", pb.BACKEND_DOCKER: "docker"}
_BACKEND_ENUM = {name: value for value, name in _BACKENDS.items()}
_POLICIES: dict[int, Literal["none", "restricted"]] = {
    pb.SCRIPT_POLICY_NONE: "none",
    pb.SCRIPT_POLICY_RESTRICTED: "restricted",
}
_ACTIONS = {
    "killed": pb.VIOLATION_ACTION_KILLED,
    "truncated": pb.VIOLATION_ACTION_TRUNCATED,
    "refused": pb.VIOLATION_ACTION_REFUSED,
}
_ACTION_NAMES = {value: name for name, value in _ACTIONS.items()}


def _status_enum(status: str) -> int:
    return int(pb.ExecutionStatus.Value("EXECUTION_STATUS_" + status.upper()))


def _call_status_enum(status: str) -> int:
    return int(pb.CallStatus.Value("CALL_STATUS_" + status.upper()))


def _enum_name(value: int, prefix: str, enum: Any) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


# -- limits ------------------------------------------------------------------------------------
def limits_from_proto(message: pb.Limits, where: str = "limits") -> Limits:
    values: dict[str, int] = {}
    for spec in LIMIT_SPECS:
        if message.HasField(spec.field):
            value = int(getattr(message, spec.field))
            if value <= 0:
                raise InvalidArgument(
                    f"{where}.{spec.field}: must be positive (leave it unset to inherit the "
                    "default)"
                )
            values[spec.field] = value
    return Limits(**values)


def limits_to_proto(limits: Limits | ResolvedLimits | Mapping[str, float]) -> pb.Limits:
    """From canonical dataclasses, or from a result's ``{name: human value}`` mapping."""
    message = pb.Limits()
    for spec in LIMIT_SPECS:
        if isinstance(limits, Mapping):
            human = limits.get(spec.name)
            value = None if human is None else round(human * spec.scale)
        else:
            value = getattr(limits, spec.field)
        if value is not None:
            setattr(message, spec.field, int(value))
    return message


def _limits_to_human(message: pb.Limits) -> dict[str, float]:
    out: dict[str, float] = {}
    for spec in LIMIT_SPECS:
        if message.HasField(spec.field):
            out[spec.name] = spec.to_human(int(getattr(message, spec.field)))
    return out


# -- requests ----------------------------------------------------------------------------------
def request_from_proto(
    message: pb.ExecuteRequest, default_policy: Literal["none", "restricted"] = "none"
) -> ExecutionRequest:
    """The request as the engine takes it; the manifest stays JSON text, parsed by the engine."""
    if message.backend and message.backend not in _BACKENDS:
        raise InvalidArgument(f"backend: unknown value {message.backend}")
    if message.policy and message.policy not in _POLICIES:
        raise InvalidArgument(f"policy: unknown value {message.policy}")
    expected: list[ExpectedCalls] = []
    for index, item in enumerate(message.expected_calls):
        where = f"expected_calls[{index}]"
        if not item.tool:
            raise InvalidArgument(f"{where}.tool: is empty")
        low = item.min if item.HasField("min") else None
        high = item.max if item.HasField("max") else None
        if low is not None and high is not None and low > high:
            raise InvalidArgument(f"{where}: min {low} is above max {high}")
        expected.append(ExpectedCalls(item.tool, low, high))
    if len(message.labels) > MAX_LABELS:
        raise InvalidArgument(f"labels: more than {MAX_LABELS} labels")
    for key, value in message.labels.items():
        if not key or len(key) > MAX_LABEL_KEY:
            raise InvalidArgument(f"labels: key {key[:40]!r} must be 1-{MAX_LABEL_KEY} characters")
        if len(value) > MAX_LABEL_VALUE:
            raise InvalidArgument(f"labels[{key!r}]: longer than {MAX_LABEL_VALUE} characters")
    return ExecutionRequest(
        script=message.script,
        manifest=message.manifest.json if message.HasField("manifest") else "[]",
        limits=limits_from_proto(message.limits),
        backend=_BACKENDS.get(message.backend),
        policy=_POLICIES.get(message.policy, default_policy),
        expected_calls=tuple(expected),
        labels=dict(message.labels),
    )


def request_to_proto(
    script: str,
    manifest_json: str,
    limits: Limits | None = None,
    backend: str | None = None,
    policy: str | None = None,
    expected_calls: tuple[ExpectedCalls, ...] = (),
    labels: Mapping[str, str] | None = None,
) -> pb.ExecuteRequest:
    message = pb.ExecuteRequest(
        script=script,
        manifest=pb.ToolManifest(json=manifest_json),
        labels=dict(labels or {}),
    )
    if limits is not None:
        message.limits.CopyFrom(limits_to_proto(limits))
    if backend is not None:
        message.backend = _BACKEND_ENUM[backend]
    if policy is not None:
        message.policy = {"none": pb.SCRIPT_POLICY_NONE, "restricted": pb.SCRIPT_POLICY_RESTRICTED}[
            policy
        ]
    for item in expected_calls:
        entry = message.expected_calls.add(tool=item.tool)
        if item.min is not None:
            entry.min = item.min
        if item.max is not None:
            entry.max = item.max
    return message


# -- results -----------------------------------------------------------------------------------
def _timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def result_to_proto(result: ExecutionResult) -> pb.ExecutionResult:
    message = pb.ExecutionResult(
        execution_id=result.execution_id,
        status=_status_enum(result.status),  # type: ignore[arg-type]
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        backend=_BACKEND_ENUM.get(result.backend, pb.BACKEND_UNSPECIFIED),
        isolation=list(result.isolation),
        effective_limits=limits_to_proto(result.effective_limits),
        usage=pb.Usage(
            wall_time_ms=round(result.usage.wall_time_s * 1000),
            cpu_time_ms=round(result.usage.cpu_time_s * 1000),
            peak_memory_bytes=result.usage.peak_memory_bytes,
            stdout_bytes=result.usage.stdout_bytes,
            stderr_bytes=result.usage.stderr_bytes,
            tool_calls=result.usage.tool_calls,
        ),
        started_at=_timestamp(result.started_at),
        finished_at=_timestamp(result.finished_at),
    )
    for call in result.calls:
        message.calls.add(
            seq=call.seq,
            tool=call.tool,
            arguments_json=_json(call.arguments),
            status=_call_status_enum(call.status),
            result_json=_json(call.result) if call.status == CallStatus.OK else "",
            error=call.error or "",
            start_offset_us=round(call.start_offset_s * 1e6),
            duration_us=round(call.duration_s * 1e6),
            idempotency_key=call.idempotency_key,
        )
    for v in result.violations:
        message.violations.add(
            limit=v.limit,
            limit_value=v.limit_value,
            observed=v.observed,
            unit=v.unit,
            action=_ACTIONS.get(v.action, pb.VIOLATION_ACTION_UNSPECIFIED),
            detail=v.detail,
        )
    if result.error is not None:
        message.error.CopyFrom(
            pb.ScriptError(
                type=result.error.type, message=result.error.message, line=result.error.line
            )
        )
    for a in result.adjustments:
        message.adjustments.add(
            limit=a.limit, requested=a.requested, applied=a.applied, action=a.action
        )
    return message


def result_from_proto(message: pb.ExecutionResult) -> ExecutionResult:
    status = _enum_name(message.status, "EXECUTION_STATUS_", pb.ExecutionStatus)
    result = ExecutionResult(
        execution_id=message.execution_id,
        status=ExecutionStatus(status),
        exit_code=message.exit_code,
        stdout=message.stdout,
        stderr=message.stderr,
        backend=_BACKENDS.get(message.backend, "unspecified"),
        isolation=list(message.isolation),
        effective_limits=_limits_to_human(message.effective_limits),
        adjustments=[
            LimitAdjustment(a.limit, a.requested, a.applied, a.action) for a in message.adjustments
        ],
        started_at=message.started_at.ToNanoseconds() / 1e9,
        finished_at=message.finished_at.ToNanoseconds() / 1e9,
        usage=Usage(
            wall_time_s=message.usage.wall_time_ms / 1000,
            cpu_time_s=message.usage.cpu_time_ms / 1000,
            peak_memory_bytes=message.usage.peak_memory_bytes,
            stdout_bytes=message.usage.stdout_bytes,
            stderr_bytes=message.usage.stderr_bytes,
            tool_calls=message.usage.tool_calls,
        ),
    )
    for c in message.calls:
        call_status = CallStatus(_enum_name(c.status, "CALL_STATUS_", pb.CallStatus))
        result.calls.append(
            CallRecord(
                seq=c.seq,
                tool=c.tool,
                arguments=_loads(c.arguments_json),
                status=call_status,
                result=_loads(c.result_json) if call_status == CallStatus.OK else None,
                error=c.error if call_status != CallStatus.OK else None,
                start_offset_s=c.start_offset_us / 1e6,
                duration_s=c.duration_us / 1e6,
                idempotency_key=c.idempotency_key,
            )
        )
    result.violations = [
        Violation(
            v.limit,
            v.limit_value,
            v.observed,
            v.unit,
            _ACTION_NAMES.get(v.action, "unspecified"),
            v.detail,
        )
        for v in message.violations
    ]
    if message.HasField("error"):
        result.error = ScriptError(message.error.type, message.error.message, message.error.line)
    return result


# -- audit -------------------------------------------------------------------------------------
def record_to_proto(record: AuditRecord) -> pb.ExecutionRecord:
    admission = record.admission
    if record.result is not None:
        result = result_to_proto(record.result)
    else:  # running or interrupted: what the admission knew
        result = pb.ExecutionResult(
            execution_id=admission.execution_id,
            status=pb.EXECUTION_STATUS_INTERRUPTED
            if record.status == "interrupted"
            else pb.EXECUTION_STATUS_UNSPECIFIED,
            backend=_BACKEND_ENUM.get(admission.backend, pb.BACKEND_UNSPECIFIED),
            effective_limits=limits_to_proto(admission.effective_limits),
            started_at=_timestamp(admission.admitted_at),
        )
    return pb.ExecutionRecord(
        result=result,
        tenant=admission.tenant,
        script=admission.script,
        script_sha256=record.script_sha256,
        manifest_sha256=admission.manifest_sha256,
        prev_hash=record.prev_hash,
        record_hash=record.record_hash,
        labels=dict(admission.labels),
    )


def query_from_proto(message: pb.ListExecutionsRequest) -> AuditQuery:
    if message.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size: at most {MAX_PAGE_SIZE}, got {message.page_size}")
    status: str | None = None
    if message.status:
        if message.status not in pb.ExecutionStatus.values():
            raise InvalidArgument(f"status: unknown value {message.status}")
        status = _enum_name(message.status, "EXECUTION_STATUS_", pb.ExecutionStatus)
    since = message.since.ToNanoseconds() / 1e9 if message.HasField("since") else None
    until = message.until.ToNanoseconds() / 1e9 if message.HasField("until") else None
    if since is not None and until is not None and until < since:
        raise InvalidArgument("until: is before since")
    if message.violation and message.violation not in {*SPEC_BY_NAME, "expected_calls", "protocol"}:
        raise InvalidArgument(f"violation: unknown limit {message.violation!r}")
    return AuditQuery(
        since=since,
        until=until,
        status=status,
        tool=message.tool or None,
        violation=message.violation or None,
        limit=message.page_size or DEFAULT_PAGE_SIZE,
        page_token=message.page_token or None,
    )
