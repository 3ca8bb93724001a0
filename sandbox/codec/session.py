"""`SessionInfo` <-> protobuf: a session's state, as the server tells it (from a live session or
an ended one's record, `sandbox.server.sessions`) and the client reads it. Its limits are the
whole-session ones, by field; an unset end time reads back as None."""

from __future__ import annotations

from typing import Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_fields_from_proto
from sandbox.codec.values import BACKEND_ENUM, BACKENDS, enum_name, seconds, timestamp
from sandbox.records import SessionInfo, SessionState

__all__ = ["session_from_proto", "session_to_proto"]

_STATES = {
    SessionState.ACTIVE: pb.SESSION_STATE_ACTIVE,
    SessionState.CLOSED: pb.SESSION_STATE_CLOSED,
    SessionState.EXPIRED: pb.SESSION_STATE_EXPIRED,
    SessionState.LOST: pb.SESSION_STATE_LOST,
    SessionState.UNSPECIFIED: pb.SESSION_STATE_UNSPECIFIED,
}


# The fields the message and `SessionInfo` share as they are (names, numbers, text).
_COPIED = (
    "session_id",
    "end_reason",
    "idle_timeout_ms",
    "max_lifetime_ms",
    "max_executions",
    "running_execution_id",
    "runtime",
)


def session_to_proto(info: SessionInfo) -> pb.SessionInfo:
    copied: dict[str, Any] = {name: getattr(info, name) for name in _COPIED}
    message = pb.SessionInfo(
        state=_STATES[info.state],
        backend=BACKEND_ENUM.get(info.backend, pb.BACKEND_UNSPECIFIED),
        limits=pb.Limits(**info.limits),  # keyed by field, as `limits_fields_from_proto` reads
        execution_ids=info.execution_ids,
        isolation=info.isolation,
        created_at=timestamp(info.created_at),
        last_used_at=timestamp(info.last_used_at),
        **copied,
    )
    if info.ended_at is not None:
        message.ended_at.CopyFrom(timestamp(info.ended_at))
    return message


def session_from_proto(message: pb.SessionInfo) -> SessionInfo:
    copied: dict[str, Any] = {name: getattr(message, name) for name in _COPIED}
    return SessionInfo(
        state=SessionState(enum_name(message.state, "SESSION_STATE_", pb.SessionState)),
        backend=BACKENDS.get(message.backend, "unspecified"),
        limits=limits_fields_from_proto(message.limits),
        execution_ids=list(message.execution_ids),
        isolation=list(message.isolation),
        created_at=seconds(message.created_at),
        last_used_at=seconds(message.last_used_at),
        ended_at=seconds(message.ended_at) if message.HasField("ended_at") else None,
        **copied,
    )
