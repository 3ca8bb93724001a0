"""Protobuf <-> the shared dataclasses (limits, requests, results): the wire form that the client
and the server both speak.

This module imports nothing from the server, the engine, the backends or the audit store, so that
`sandbox.client` stays a light import. The server's own conversions (an incoming request to the
engine's `ExecutionRequest`, audit records, list queries) live in `sandbox.server.convert`. JSON
values travel as JSON text (see the proto's conventions); times become the proto's unit-named
integer fields.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Literal

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb
from sandbox.errors import InvalidArgument
from sandbox.files import FileDigest, InputFile, OmittedOutput, OutputFile, check_inputs
from sandbox.limits import (
    CEILINGS,
    LIMIT_SPECS,
    SPEC_BY_FIELD,
    LimitAdjustment,
    Limits,
    ResolvedLimits,
    check_labels,
    check_manifest_size,
    check_script_size,
)
from sandbox.options import RunOptions
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

__all__ = [
    "BACKENDS",
    "BACKEND_ENUM",
    "POLICIES",
    "enum_name",
    "input_files_from_proto",
    "limits_fields_from_proto",
    "limits_from_proto",
    "limits_to_proto",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
    "timestamp",
]

BACKENDS = {
    pb.BACKEND_PROCESS: "process",
    pb.BACKEND_DOCKER: "docker",
    pb.BACKEND_GVISOR: "gvisor",
}
BACKEND_ENUM = {name: value for value, name in BACKENDS.items()}
POLICIES: dict[int, Literal["none", "restricted"]] = {
    pb.SCRIPT_POLICY_NONE: "none",
    pb.SCRIPT_POLICY_RESTRICTED: "restricted",
}
_POLICY_ENUM = {"none": pb.SCRIPT_POLICY_NONE, "restricted": pb.SCRIPT_POLICY_RESTRICTED}
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


@functools.cache  # a handful of statuses; an unknown one raises, and is not cached
def _status_enum(status: str) -> int:
    return int(pb.ExecutionStatus.Value("EXECUTION_STATUS_" + status.upper()))


@functools.cache
def _call_status_enum(status: str) -> int:
    return int(pb.CallStatus.Value("CALL_STATUS_" + status.upper()))


def enum_name(value: int, prefix: str, enum: Any) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


# Each result the client reads carries its status and its limits: looked up, not recomputed.
_STATUSES = {
    value: ExecutionStatus(name)
    for value in pb.ExecutionStatus.values()
    if (name := enum_name(value, "EXECUTION_STATUS_", pb.ExecutionStatus)) in set(ExecutionStatus)
}
_LIMIT_FIELDS = {d: d.name for d in pb.Limits.DESCRIPTOR.fields if d.name in SPEC_BY_FIELD}
_NO_LIMITS = Limits()  # frozen: one for every request that sets none
# google.protobuf.Timestamp's documented range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_TIMESTAMP_S = -62_135_596_800
_MAX_TIMESTAMP_S = 253_402_300_799


# -- limits ------------------------------------------------------------------------------------
def limits_from_proto(message: pb.Limits, where: str = "limits") -> Limits:
    values: dict[str, int] = {}
    # The fields set, in field-number order (the limits' own order): most requests set none.
    for descriptor, raw in message.ListFields():
        spec = SPEC_BY_FIELD.get(descriptor.name)
        if spec is not None:
            value = int(raw)
            if value <= 0:
                raise InvalidArgument(
                    f"{where}.{spec.field}: must be positive (leave it unset to inherit the "
                    "default)"
                )
            values[spec.field] = spec.check(value, f"{where}.{spec.field}")
    return Limits(**values) if values else _NO_LIMITS


def limits_to_proto(limits: Limits | ResolvedLimits | Mapping[str, float]) -> pb.Limits:
    """From canonical dataclasses, or from a mapping keyed by field (``wall_time_ms``, what
    results and audit records carry) or, in records written before that, by limit name in the
    limit's report unit (``wall_time`` in seconds)."""
    if isinstance(limits, Mapping) and limits.keys() <= SPEC_BY_FIELD.keys():
        # Keyed by field, as every result is: built in one call (a result's hot path).
        return pb.Limits(**{field: int(value) for field, value in limits.items()})
    message = pb.Limits()
    for spec in LIMIT_SPECS:
        value: float | None
        if not isinstance(limits, Mapping):
            value = getattr(limits, spec.field)
        elif spec.field in limits:
            value = limits[spec.field]
        else:
            human = limits.get(spec.name)
            value = None if human is None else round(human * spec.scale)
        if value is not None:
            setattr(message, spec.field, int(value))
    return message


def limits_fields_from_proto(message: pb.Limits) -> dict[str, int]:
    """The set fields of ``message`` as ``{field: value}``, as a result carries them (in field
    number order, which is `LIMIT_SPECS` order)."""
    return {
        _LIMIT_FIELDS[descriptor]: int(value)
        for descriptor, value in message.ListFields()
        if descriptor in _LIMIT_FIELDS
    }


# -- requests ----------------------------------------------------------------------------------
def request_to_proto(
    script: str, manifest_json: str | None, options: RunOptions | None = None
) -> pb.ExecuteRequest:
    """The request as the client sends it (``manifest_json`` None: a session cell keeps the
    session's tools), refused before sending (with the message the server or the embedded
    engine would give) when it is larger than any server accepts: the script and manifest caps,
    and the input files under the ceilings (a tenant's may be lower, which only its server
    knows). ``options.timeout`` is the call's, not the request's."""
    options = options or RunOptions()
    check_script_size(script)
    if manifest_json is not None:
        check_manifest_size(manifest_json)
    check_inputs(options.files, CEILINGS)
    check_labels(options.labels)
    message = pb.ExecuteRequest(
        script=script, labels=dict(options.labels), session_id=options.session_id
    )
    if manifest_json is not None:
        message.manifest.json = manifest_json
    if options.limits is not None:
        message.limits.CopyFrom(limits_to_proto(options.limits))
    if options.backend is not None:
        message.backend = BACKEND_ENUM[options.backend]
    if options.policy is not None:
        message.policy = _POLICY_ENUM[options.policy]
    if options.runtime:
        message.runtime = options.runtime
    if options.idempotency_key:
        message.idempotency_key = options.idempotency_key
    for item in options.expected_calls:
        entry = message.expected_calls.add(tool=item.tool)
        if item.min is not None:
            entry.min = item.min
        if item.max is not None:
            entry.max = item.max
    for input_file in options.files:
        message.input_files.add(name=input_file.name, content=input_file.data)
    return message


def input_files_from_proto(message: pb.ExecuteRequest) -> tuple[InputFile, ...]:
    """The request's input files (their names and limits are checked by the engine)."""
    return tuple(InputFile(f.name, f.content) for f in message.input_files)


# -- results -----------------------------------------------------------------------------------
def timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def _stamp(seconds: float) -> Timestamp | dict[str, int]:
    """`timestamp`'s fields, for a message's constructor to fill in place (half the cost of
    building a `Timestamp` and copying it); one out of its range goes through `timestamp`,
    which refuses it as before."""
    whole, nanos = divmod(int(seconds * 1e9), 1_000_000_000)
    if not _MIN_TIMESTAMP_S <= whole <= _MAX_TIMESTAMP_S:
        return timestamp(seconds)
    return {"seconds": whole, "nanos": nanos}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


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
        effective_limits={field: int(value) for field, value in limits.items()}
        if limits.keys() <= SPEC_BY_FIELD.keys()
        else limits_to_proto(limits),
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
            evidence=_EVIDENCE.get(v.evidence, pb.VIOLATION_EVIDENCE_UNSPECIFIED),
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
    for d in result.input_files:
        message.input_files.add(name=d.name, size_bytes=d.size, sha256=d.sha256)
    for f in result.output_files:
        message.output_files.add(name=f.name, size_bytes=f.size, sha256=f.sha256, content=f.data)
    for o in result.omitted_outputs:
        message.omitted_outputs.add(
            name=o.name, reason=o.reason, size_bytes=o.size, limit_value=o.limit, detail=o.detail
        )
    return message


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
        effective_limits=limits_fields_from_proto(message.effective_limits),
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
    # Most results have no calls, violations or files: an empty repeated field is asked for its
    # length (cheap) instead of iterated (about 2.5 us each), its list left the default one.
    for c in message.calls if message.calls else ():
        call_status = CallStatus(enum_name(c.status, "CALL_STATUS_", pb.CallStatus))
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
    if message.violations:
        result.violations = [
            Violation(
                v.limit,
                v.limit_value,
                v.observed if v.HasField("observed") else None,
                v.unit,
                _ACTION_NAMES.get(v.action, "unspecified"),
                v.detail,
                evidence=_EVIDENCE_NAMES.get(v.evidence, Evidence.UNSPECIFIED),
            )
            for v in message.violations
        ]
    if message.HasField("error"):
        result.error = ScriptError(message.error.type, message.error.message, message.error.line)
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
    return result
