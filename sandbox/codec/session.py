"""`SessionInfo` from protobuf: a session's state as the client reads it. The server writes the
message in `sandbox.server.sessions`, from a live session or from an ended one's record."""

from __future__ import annotations

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_fields_from_proto
from sandbox.codec.values import BACKENDS, enum_name, seconds
from sandbox.records import SessionInfo, SessionState

__all__ = ["session_from_proto"]


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
