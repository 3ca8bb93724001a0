"""A session's own audit record: admitted at `create`, completed at its end with how it ended,
and read back to say how a session this server does not hold ended.

Each session is one record in its tenant's chain (label ``ptc.kind = session``, its settings as
labels `sandbox.sessions.rebuild` reads back); each of its cells is a record of its own, labelled
``ptc.session_id``, written by `sandbox.recording.Recorder` like any execution's.
"""

from __future__ import annotations

import contextlib
import logging
import time

from sandbox.audit.base import Admission, AuditStore
from sandbox.errors import NotFound, quote
from sandbox.request_caps import (
    IDLE_TIMEOUT_LABEL,
    KIND_LABEL,
    MAX_EXECUTIONS_LABEL,
    MAX_LIFETIME_LABEL,
)
from sandbox.result import ExecutionResult, ExecutionStatus, ScriptError, Usage
from sandbox.sessions.session import Session, SessionState

__all__ = ["admit_record", "complete_record", "gone_error"]

log = logging.getLogger(__name__)


def admit_record(store: AuditStore | None, session: Session) -> None:
    """Admits ``session``'s record; a store that refuses raises, and no session runs
    unrecorded."""
    if store is None:
        return
    settings = session.settings
    store.admit(
        Admission(
            execution_id=session.id,
            tenant=session.tenant,
            script="",
            manifest_json=session.manifest_json,
            manifest_sha256=session.manifest.sha256,
            backend=session.backend,
            policy="none",
            effective_limits=settings.limits,
            labels={
                **session.labels,
                KIND_LABEL: "session",
                IDLE_TIMEOUT_LABEL: str(int(settings.idle_timeout_s * 1000)),
                MAX_LIFETIME_LABEL: str(int(settings.max_lifetime_s * 1000)),
                MAX_EXECUTIONS_LABEL: str(settings.max_executions),
            },
            admitted_at=session.created_at,
            runtime=session.runtime or "",
        )
    )


def complete_record(
    store: AuditStore | None,
    session: Session,
    status: ExecutionStatus,
    cpu_s: float,
    peak_memory: int,
) -> None:
    """Completes the record of ``session``, which has ended: its state and reason (typed, in
    ``session_end``, and in words as the error), its usage. A store that refuses is logged:
    the session has ended either way."""
    if store is None:
        return
    ended = session.ended_at or time.time()
    result = ExecutionResult(
        execution_id=session.id,
        status=status,
        exit_code=0,
        backend=session.backend,
        isolation=session.sandbox.isolation,
        effective_limits=session.settings.limits,
        error=ScriptError("SessionEnded", f"{session.state.value}: {session.reason}"[:2000]),
        usage=Usage(
            wall_time_s=ended - session.created_at,
            cpu_time_s=cpu_s,
            peak_memory_bytes=peak_memory,
            tool_calls=session.tool_calls,
        ),
        started_at=session.created_at,
        finished_at=ended,
        session_id=session.id,
        session_lost="" if session.state is SessionState.CLOSED else session.reason,
        session_end=session.end(),
    )
    try:
        store.complete(session.id, result)
    except Exception:
        log.exception("the audit record of session %s could not be completed", session.id)


def gone_error(store: AuditStore | None, tenant: str, session_id: str) -> NotFound:
    """NOT_FOUND for an id this server does not hold; where the audit store recorded the
    session (an earlier server's, ended by its stop or restart), the message says how it
    ended, so a client learns why its session is gone rather than that it never was."""
    record = None
    if store is not None:
        with contextlib.suppress(Exception):  # the store is a courtesy here, not a need
            record = store.get(tenant, session_id)
    if record is None or record.admission.labels.get(KIND_LABEL) != "session":
        return NotFound(f"session_id: no session {quote(session_id)}")
    if record.result is None and record.interrupted_reason:
        how = f"{record.status}: {record.interrupted_reason}"
    elif record.result is None:
        how = f"{record.status}: the server that held it stopped before ending it"
    elif record.result.session_end is not None:
        how = f"{record.result.session_end.state}: {record.result.session_end.reason}"
    elif record.result.error is not None:  # written before the end was typed
        how = record.result.error.message
    else:
        how = record.status
    if record.status == "interrupted" and store is not None and store.holds_sessions:
        # Still open in the record: Execute rebuilds it (`sandbox.sessions.rebuild`).
        how += "; its next execution rebuilds it from its record"
    return NotFound(f"session_lost: session {quote(session_id)} is gone: {how}")
