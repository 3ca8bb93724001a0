"""`ListExecutionsRequest` <-> an `ExecutionQuery`: which audit records a listing returns.

The client refuses a status it does not know before sending; the server checks every field it
reads (page size, status, the time range, the violation's limit, the session id, the page
token) and refuses a bad one with `InvalidArgument` naming the field. A record not yet ended is
asked for with the message's ``running`` flag, the query's status `RUNNING`.
"""

from __future__ import annotations

import re

from google.protobuf.timestamp_pb2 import Timestamp

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.values import MAX_TIMESTAMP_S, MIN_TIMESTAMP_S, enum_name, timestamp
from sandbox.errors import InvalidArgument, quote
from sandbox.limits import SPEC_BY_NAME
from sandbox.records import RUNNING, ExecutionQuery
from sandbox.result import ExecutionStatus

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "SESSION_ID",
    "query_from_proto",
    "query_to_proto",
]

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50
SESSION_ID = re.compile(r"s-[0-9a-f]{32}")
_MAX_PAGE_TOKEN = 256  # tokens the stores issue are a few characters
_VIOLATIONS = {*SPEC_BY_NAME, "expected_calls", "protocol"}


def query_to_proto(query: ExecutionQuery | None) -> pb.ListExecutionsRequest:
    message = pb.ListExecutionsRequest()
    if query is None:
        return message
    if query.since is not None:
        message.since.CopyFrom(timestamp(query.since))
    if query.until is not None:
        message.until.CopyFrom(timestamp(query.until))
    if query.status == RUNNING:
        message.running = True
    elif query.status is not None:
        if query.status not in set(ExecutionStatus):
            known = ", ".join([*(s.value for s in ExecutionStatus), RUNNING])
            raise InvalidArgument(f"status: unknown status {query.status!r} (known: {known})")
        message.MergeFrom(
            pb.ListExecutionsRequest(status="EXECUTION_STATUS_" + query.status.upper())
        )
    message.tool = query.tool or ""
    message.violation = query.violation or ""
    message.page_size = query.page_size or 0
    message.page_token = query.page_token
    message.session_id = query.session_id
    return message


def query_from_proto(message: pb.ListExecutionsRequest) -> ExecutionQuery:
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
        status = RUNNING
    since = _seconds(message.since, "since") if message.HasField("since") else None
    until = _seconds(message.until, "until") if message.HasField("until") else None
    if since is not None and until is not None and until < since:
        raise InvalidArgument("until: is before since")
    if message.violation and message.violation not in _VIOLATIONS:
        raise InvalidArgument(f"violation: unknown limit {quote(message.violation)}")
    if message.session_id and not SESSION_ID.fullmatch(message.session_id):
        raise InvalidArgument(f"session_id: {quote(message.session_id)} is not a session id")
    if len(message.page_token) > _MAX_PAGE_TOKEN:
        raise InvalidArgument(
            f"page_token: {quote(message.page_token)} is not a token this server issued"
        )
    return ExecutionQuery(
        since=since,
        until=until,
        status=status,
        tool=message.tool or None,
        violation=message.violation or None,
        page_size=message.page_size or None,
        page_token=message.page_token,
        session_id=message.session_id,
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
