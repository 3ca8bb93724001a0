"""`SessionInfo` <-> protobuf: a session's state, as the server tells it (from a live session or
an ended one's record, `sandbox.server.sessions`) and the client reads it. Its limits are the
whole-session ones, by field; an unset end time reads back as None."""

from __future__ import annotations

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_fields_from_proto, limits_to_proto
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


def session_to_proto(info: SessionInfo) -> pb.SessionInfo:
    message = pb.SessionInfo(
        session_id=info.session_id,
        state=_STATES[info.state],
        end_reason=info.end_reason,
        backend=BACKEND_ENUM.get(info.backend, pb.BACKEND_UNSPECIFIED),
        limits=limits_to_proto(info.limits),
        idle_timeout_ms=info.idle_timeout_ms,
        max_lifetime_ms=info.max_lifetime_ms,
        max_executions=info.max_executions,
        execution_ids=info.execution_ids,
        running_execution_id=info.running_execution_id,
        created_at=timestamp(info.created_at),
        last_used_at=timestamp(info.last_used_at),
        isolation=info.isolation,
        runtime=info.runtime,
    )
    if info.ended_at is not None:
        message.ended_at.CopyFrom(timestamp(info.ended_at))
    return message


def session_from_proto(message: pb.SessionInfo) -> SessionInfo:
    return SessionInfo(
        session_id=message.session_id,
        state=SessionState(enum_name(message.state, "SESSION_STATE_", pb.SessionState)),
        end_reason=message.end_reason,
        backend=BACKENDS.get(message.backend, "unspecified"),
        limits=limits_fields_from_proto(message.limits),
        idle_timeout_ms=message.idle_timeout_ms,
        max_lifetime_ms=message.max_lifetime_ms,
        max_executions=message.max_executions,
        execution_ids=list(message.execution_ids),
        running_execution_id=message.running_execution_id,
        created_at=seconds(message.created_at),
        last_used_at=seconds(message.last_used_at),
        ended_at=seconds(message.ended_at) if message.HasField("ended_at") else None,
        isolation=list(message.isolation),
        runtime=message.runtime,
    )
