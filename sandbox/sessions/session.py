"""A session as its manager holds it: its state, its settings and its sandbox.

Kept apart from `manager` so that `rebuild`, which makes sessions from their audit record, and
`manager`, which runs them, share the types without importing each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sandbox.errors import FailedPrecondition, NotFound, PtcError
from sandbox.execution.cell import SessionSandbox
from sandbox.limits import ResolvedLimits
from sandbox.result import SessionEnd, SessionEndState
from stubs_gen import Manifest

__all__ = ["RebuildClock", "Session", "SessionSettings", "SessionState", "error_text"]


class SessionState(StrEnum):
    ACTIVE = "active"
    CLOSED = "closed"
    EXPIRED = "expired"
    LOST = "lost"


@dataclass(frozen=True)
class SessionSettings:
    """What a session was created with, after the tenant's ceilings."""

    limits: ResolvedLimits  # memory, processes, file_size, open_files; cpu_time is the total
    idle_timeout_s: float
    max_lifetime_s: float
    max_executions: int  # 0: no limit


@dataclass(frozen=True)
class RebuildClock:
    """When a session rebuilt on this server (`sandbox.sessions.rebuild`) passed its first two
    clock points, on `time.monotonic`'s clock; the third, its first replayed cell's start, is
    its sandbox's `SessionSandbox.first_job_at` (the first job frame sent). What a take-over
    costs before anything runs is read from these (`bench.session_rebuild`)."""

    asked: float  # a request found no holder of the session here and began its rebuild
    taken_over: float  # the store's take-over committed: this server is the session's holder


@dataclass
class Session:
    id: str
    tenant: str
    backend: str
    manifest: Manifest
    manifest_json: str
    settings: SessionSettings
    labels: Mapping[str, str]
    sandbox: SessionSandbox
    runtime: str | None = None  # every cell runs in it; None: the standard library
    created_at: float = field(default_factory=time.time)
    last_used_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    state: SessionState = SessionState.ACTIVE
    reason: str = ""
    executions: list[str] = field(default_factory=list)
    running: str | None = None  # the execution running now
    tool_calls: int = 0
    _created_mono: float = field(default_factory=time.monotonic)
    _used_mono: float = field(default_factory=time.monotonic)
    _doom: str | None = None  # why the sweeper killed the sandbox under a running execution
    rebuilt: RebuildClock | None = None  # set when this server rebuilt it from its record

    @property
    def active(self) -> bool:
        return self.state is SessionState.ACTIVE

    def end(self) -> SessionEnd:
        """How this ended session ended, as its record's completion carries it (typed)."""
        return SessionEnd(SessionEndState(self.state.value), self.reason[:2000])

    def gone_error(self) -> FailedPrecondition | NotFound:
        message = f"session_lost: session {self.id!r} is {self.state.value}: {self.reason}"
        if self.state is SessionState.LOST:
            return FailedPrecondition(message)
        return NotFound(message)


def error_text(error: BaseException | None) -> str:
    """What an error that ended a session (a cell's run, a rebuild) says in its reason: its
    class and its message, never only that the service failed."""
    if error is None:
        return "the run gave no result"
    if isinstance(error, asyncio.CancelledError):
        return "it was cancelled before it gave a result"
    message = error.message if isinstance(error, PtcError) else str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
