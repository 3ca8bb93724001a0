"""The server's own protobuf conversions: an incoming request to the engine's `ExecutionRequest`,
audit records, and list queries. The conversions the client shares (limits, results) live in
`sandbox.wire` and are re-exported here.

Every field of a request is checked here on the way in, and a bad one raises `InvalidArgument`
whose message starts with the field's path (``limits.memory_bytes: ...``,
``expected_calls[1].tool: ...``), which the error interceptor sends as INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
from typing import Literal

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import AuditQuery, AuditRecord
from sandbox.engine import ExecutionRequest
from sandbox.errors import InvalidArgument, quote
from sandbox.expectations import ExpectedCalls
from sandbox.limits import SPEC_BY_NAME, check_labels
from sandbox.wire import (
    BACKEND_ENUM,
    BACKENDS,
    POLICIES,
    enum_name,
    input_files_from_proto,
    limits_from_proto,
    limits_to_proto,
    request_to_proto,
    result_from_proto,
    result_to_proto,
    timestamp,
)

__all__ = [
    "check_idempotency_key",
    "limits_from_proto",
    "limits_to_proto",
    "query_from_proto",
    "record_to_proto",
    "request_from_proto",
    "request_to_proto",
    "result_from_proto",
    "result_to_proto",
]

MAX_PAGE_SIZE = 1000
SESSION_ID = re.compile(r"s-[0-9a-f]{32}")
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_TOKEN = 256  # tokens the stores issue are a few characters
MAX_EXPECTED_CALLS = 256
MAX_NAME_CHARS = 256  # tool names, runtime names, ids
MAX_KEY_CHARS = 128  # an idempotency key: a uuid4 is 36
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
# google.protobuf.Timestamp's documented range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
MIN_TIMESTAMP_S = -62_135_596_800
MAX_TIMESTAMP_S = 253_402_300_799


# -- requests ----------------------------------------------------------------------------------
def request_from_proto(
    message: pb.ExecuteRequest, default_policy: Literal["none", "restricted"] = "none"
) -> ExecutionRequest:
    """The request as the engine takes it; the manifest stays JSON text, parsed by the engine."""
    if message.backend and message.backend not in BACKENDS:
        raise InvalidArgument(f"backend: unknown value {message.backend}")
    if message.policy and message.policy not in POLICIES:
        raise InvalidArgument(f"policy: unknown value {message.policy}")
    expected: list[ExpectedCalls] = []
    if len(message.expected_calls) > MAX_EXPECTED_CALLS:
        raise InvalidArgument(f"expected_calls: more than {MAX_EXPECTED_CALLS} entries")
    if len(message.runtime) > MAX_NAME_CHARS:
        raise InvalidArgument(f"runtime: longer than {MAX_NAME_CHARS} characters")
    # Most requests leave the repeated and map fields empty: asking one for its length is cheap,
    # iterating it even empty is not (~2.5 us each).
    for index, item in enumerate(message.expected_calls) if message.expected_calls else ():
        where = f"expected_calls[{index}]"
        if not item.tool:
            raise InvalidArgument(f"{where}.tool: is empty")
        if len(item.tool) > MAX_NAME_CHARS:
            raise InvalidArgument(f"{where}.tool: longer than {MAX_NAME_CHARS} characters")
        low = item.min if item.HasField("min") else None
        high = item.max if item.HasField("max") else None
        if low is not None and high is not None and low > high:
            raise InvalidArgument(f"{where}: min {low} is above max {high}")
        expected.append(ExpectedCalls(item.tool, low, high))
    labels = dict(message.labels) if message.labels else {}
    check_labels(labels)
    return ExecutionRequest(
        script=message.script,
        manifest=message.manifest.json if message.HasField("manifest") else "[]",
        limits=limits_from_proto(message.limits),
        backend=BACKENDS.get(message.backend),
        policy=POLICIES.get(message.policy, default_policy),
        expected_calls=tuple(expected),
        labels=labels,
        files=input_files_from_proto(message) if message.input_files else (),
        runtime=message.runtime or None,
        idempotency_key=check_idempotency_key(message.idempotency_key),
    )


def check_idempotency_key(key: str) -> str:
    """``key`` when it is a usable idempotency key (or empty), else `InvalidArgument`."""
    if len(key) > MAX_KEY_CHARS:
        raise InvalidArgument(
            f"idempotency_key: longer than {MAX_KEY_CHARS} characters ({quote(key)})"
        )
    if key and not IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidArgument(
            f"idempotency_key: {quote(key)} has a character outside printable ASCII (or a space)"
        )
    return key


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
            backend=BACKEND_ENUM.get(admission.backend, pb.BACKEND_UNSPECIFIED),
            effective_limits=limits_to_proto(admission.effective_limits),
            started_at=timestamp(admission.admitted_at),
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
        replay_of=admission.replay_of,
        runtime=admission.runtime,
        idempotency_key=admission.idempotency_key,
        interrupted_reason=record.interrupted_reason or "",
    )


def query_from_proto(message: pb.ListExecutionsRequest) -> AuditQuery:
    if message.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size: at most {MAX_PAGE_SIZE}, got {message.page_size}")
    status: str | None = None
    if message.status:
        if message.status not in pb.ExecutionStatus.values():
            raise InvalidArgument(f"status: unknown value {message.status}")
        status = enum_name(message.status, "EXECUTION_STATUS_", pb.ExecutionStatus)
    if message.running:
        if status is not None:
            raise InvalidArgument("running: set together with status; ask for one")
        status = "running"  # the audit's own status of a record not yet ended
    since = _seconds(message.since, "since") if message.HasField("since") else None
    until = _seconds(message.until, "until") if message.HasField("until") else None
    if since is not None and until is not None and until < since:
        raise InvalidArgument("until: is before since")
    if message.violation and message.violation not in {*SPEC_BY_NAME, "expected_calls", "protocol"}:
        raise InvalidArgument(f"violation: unknown limit {quote(message.violation)}")
    if message.session_id and not SESSION_ID.fullmatch(message.session_id):
        raise InvalidArgument(f"session_id: {quote(message.session_id)} is not a session id")
    if len(message.page_token) > MAX_PAGE_TOKEN:
        raise InvalidArgument(
            f"page_token: {quote(message.page_token)} is not a token this server issued"
        )
    return AuditQuery(
        session_id=message.session_id or None,
        since=since,
        until=until,
        status=status,
        tool=message.tool or None,
        violation=message.violation or None,
        limit=message.page_size or DEFAULT_PAGE_SIZE,
        page_token=message.page_token or None,
    )


def _seconds(stamp: Timestamp, field: str) -> float:
    """A request's timestamp in seconds; refuses one outside `Timestamp`'s documented range."""
    if not 0 <= stamp.nanos <= 999_999_999:
        raise InvalidArgument(f"{field}.nanos: {stamp.nanos} is outside 0 to 999999999")
    if not MIN_TIMESTAMP_S <= stamp.seconds <= MAX_TIMESTAMP_S:
        raise InvalidArgument(
            f"{field}.seconds: {stamp.seconds} is outside {MIN_TIMESTAMP_S} to {MAX_TIMESTAMP_S} "
            "(years 1 to 9999)"
        )
    return stamp.seconds + stamp.nanos / 1e9
