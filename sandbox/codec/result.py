"""`ExecutionResult` <-> protobuf: what every execution answers, on the client's and the
server's hot path (each half built field by field, sub-messages filled in place; repeated fields
read only when not empty). Times become the proto's unit-named integers (``wall_time_ms``,
``start_offset_us``), JSON values JSON text."""

from __future__ import annotations

import functools

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import resolved_from_proto
from sandbox.codec.values import (
    BACKEND_ENUM,
    BACKENDS,
    MAX_TIMESTAMP_S,
    MIN_TIMESTAMP_S,
    enum_name,
    json_text,
    timestamp,
    value_of_json_text,
)
from sandbox.files import FileDigest, OmittedOutput, OutputFile
from sandbox.limits import LimitAdjustment
from sandbox.result import (
    CallRecord,
    CallStatus,
    Evidence,
    ExecutionResult,
    ExecutionStatus,
    ScriptError,
    Usage,
    Violation,
)

__all__ = ["result_from_proto", "result_to_proto"]

_ACTIONS = {
    "killed": pb.VIOLATION_ACTION_KILLED,
    "truncated": pb.VIOLATION_ACTION_TRUNCATED,
    "refused": pb.VIOLATION_ACTION_REFUSED,
    "reported": pb.VIOLATION_ACTION_REPORTED,
    "interrupted": pb.VIOLATION_ACTION_INTERRUPTED,
}
_ACTION_NAMES = {value: name for name, value in _ACTIONS.items()}
_EVIDENCE = {
    Evidence.KERNEL: pb.VIOLATION_EVIDENCE_KERNEL,
    Evidence.HOST: pb.VIOLATION_EVIDENCE_HOST,
    Evidence.GUEST: pb.VIOLATION_EVIDENCE_GUEST,
}
_EVIDENCE_NAMES = {value: name for name, value in _EVIDENCE.items()}
# Each result the client reads carries its status: looked up, not recomputed.
_STATUSES = {
    value: ExecutionStatus(name)
    for value in pb.ExecutionStatus.values()
    if (name := enum_name(value, "EXECUTION_STATUS_", pb.ExecutionStatus)) in set(ExecutionStatus)
}


@functools.cache  # a handful of statuses; an unknown one raises, and is not cached
def _status_enum(status: str) -> int:
    return int(pb.ExecutionStatus.Value("EXECUTION_STATUS_" + status.upper()))


@functools.cache
def _call_status_enum(status: str) -> int:
    return int(pb.CallStatus.Value("CALL_STATUS_" + status.upper()))


def _stamp(seconds: float) -> Timestamp | dict[str, int]:
    """`timestamp`'s fields, for a message's constructor to fill in place (half the cost of
    building a `Timestamp` and copying it); one out of its range goes through `timestamp`,
    which refuses it."""
    whole, nanos = divmod(round(seconds * 1e9), 1_000_000_000)
    if not MIN_TIMESTAMP_S <= whole <= MAX_TIMESTAMP_S:
        return timestamp(seconds)
    return {"seconds": whole, "nanos": nanos}


def result_to_proto(result: ExecutionResult) -> pb.ExecutionResult:
    # Sub-messages given as their fields, filled in place, not built apart and copied.
    limits = result.effective_limits
    usage = result.usage
    message = pb.ExecutionResult(
        execution_id=result.execution_id,
        status=_status_enum(result.status),  # type: ignore[arg-type]
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        backend=BACKEND_ENUM.get(result.backend, pb.BACKEND_UNSPECIFIED),
        isolation=list(result.isolation),
        effective_limits=None if limits is None else limits.to_fields(),
        usage={
            "wall_time_ms": round(usage.wall_time_s * 1000),
            "cpu_time_ms": round(usage.cpu_time_s * 1000),
            "peak_memory_bytes": usage.peak_memory_bytes,
            "stdout_bytes": usage.stdout_bytes,
            "stderr_bytes": usage.stderr_bytes,
            "tool_calls": usage.tool_calls,
        },
        started_at=_stamp(result.started_at),
        finished_at=_stamp(result.finished_at),
        session_id=result.session_id,
        session_lost=result.session_lost,
    )
    if result.value is not None:
        message.value = result.value
    if result.error is not None:
        message.error.CopyFrom(
            pb.ScriptError(
                type=result.error.type, message=result.error.message, line=result.error.line
            )
        )
    _add_calls_and_violations(message, result)
    _add_adjustments_and_files(message, result)
    return message


def _add_calls_and_violations(message: pb.ExecutionResult, result: ExecutionResult) -> None:
    for call in result.calls:
        message.calls.add(
            seq=call.seq,
            tool=call.tool,
            arguments_json=json_text(call.arguments),
            status=_call_status_enum(call.status),
            result_json=json_text(call.result) if call.status == CallStatus.OK else "",
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
            evidence=_EVIDENCE.get(v.evidence, pb.VIOLATION_EVIDENCE_UNSPECIFIED),
        )


def _add_adjustments_and_files(message: pb.ExecutionResult, result: ExecutionResult) -> None:
    for a in result.adjustments:
        message.adjustments.add(
            limit=a.limit, requested=a.requested, applied=a.applied, action=a.action
        )
    for d in result.input_files:
        message.input_files.add(name=d.name, size_bytes=d.size, sha256=d.sha256)
    for f in result.output_files:
        message.output_files.add(name=f.name, size_bytes=f.size, sha256=f.sha256, content=f.data)
    for o in result.omitted_outputs:
        message.omitted_outputs.add(
            name=o.name, reason=o.reason, size_bytes=o.size, limit_value=o.limit, detail=o.detail
        )


def result_from_proto(message: pb.ExecutionResult) -> ExecutionResult:
    status = _STATUSES.get(message.status)
    if status is None:  # unspecified, or unknown to this client: refused as it always was
        status = ExecutionStatus(enum_name(message.status, "EXECUTION_STATUS_", pb.ExecutionStatus))
    usage = message.usage
    result = ExecutionResult(
        execution_id=message.execution_id,
        status=status,
        exit_code=message.exit_code,
        stdout=message.stdout,
        stderr=message.stderr,
        backend=BACKENDS.get(message.backend, "unspecified"),
        isolation=list(message.isolation),
        effective_limits=resolved_from_proto(message.effective_limits),
        adjustments=[
            LimitAdjustment(a.limit, a.requested, a.applied, a.action) for a in message.adjustments
        ]
        if message.adjustments
        else [],
        started_at=message.started_at.ToNanoseconds() / 1e9,
        finished_at=message.finished_at.ToNanoseconds() / 1e9,
        session_id=message.session_id,
        value=message.value if message.HasField("value") else None,
        session_lost=message.session_lost,
        usage=Usage(
            wall_time_s=usage.wall_time_ms / 1000,
            cpu_time_s=usage.cpu_time_ms / 1000,
            peak_memory_bytes=usage.peak_memory_bytes,
            stdout_bytes=usage.stdout_bytes,
            stderr_bytes=usage.stderr_bytes,
            tool_calls=usage.tool_calls,
        ),
    )
    if message.HasField("error"):
        result.error = ScriptError(message.error.type, message.error.message, message.error.line)
    # Most results have no calls, violations or files: an empty repeated field is asked for its
    # length (cheap) instead of iterated (about 2.5 us each), its list left the default one.
    if message.calls:
        result.calls = [_call_from_proto(c) for c in message.calls]
    if message.violations:
        result.violations = [_violation_from_proto(v) for v in message.violations]
    if message.input_files or message.output_files or message.omitted_outputs:
        _read_files(message, result)
    return result


def _call_from_proto(c: pb.CallRecord) -> CallRecord:
    call_status = CallStatus(enum_name(c.status, "CALL_STATUS_", pb.CallStatus))
    return CallRecord(
        seq=c.seq,
        tool=c.tool,
        arguments=value_of_json_text(c.arguments_json),
        status=call_status,
        result=value_of_json_text(c.result_json) if call_status == CallStatus.OK else None,
        error=c.error if call_status != CallStatus.OK else None,
        start_offset_s=c.start_offset_us / 1e6,
        duration_s=c.duration_us / 1e6,
        idempotency_key=c.idempotency_key,
    )


def _violation_from_proto(v: pb.Violation) -> Violation:
    return Violation(
        v.limit,
        v.limit_value,
        v.observed if v.HasField("observed") else None,
        v.unit,
        _ACTION_NAMES.get(v.action, "unspecified"),
        v.detail,
        evidence=_EVIDENCE_NAMES.get(v.evidence, Evidence.UNSPECIFIED),
    )


def _read_files(message: pb.ExecutionResult, result: ExecutionResult) -> None:
    if message.input_files:
        result.input_files = [
            FileDigest(d.name, d.size_bytes, d.sha256) for d in message.input_files
        ]
    if message.output_files:
        result.output_files = [
            OutputFile(f.name, f.size_bytes, f.sha256, f.content) for f in message.output_files
        ]
    if message.omitted_outputs:
        result.omitted_outputs = [
            OmittedOutput(
                o.name,
                o.reason,
                o.size_bytes if o.HasField("size_bytes") else None,
                o.limit_value if o.HasField("limit_value") else None,
                o.detail,
            )
            for o in message.omitted_outputs
        ]
