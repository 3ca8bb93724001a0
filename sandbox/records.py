"""The SDK's own types for what the service answers besides a result: an audit record
(`ExecutionRecord`), a page of them (`ExecutionPage`) and the query for one (`ExecutionQuery`),
and a session's state (`SessionInfo`). Like `sandbox.result`, they are shared by the client and
the server, which convert them from and to the wire in `sandbox.codec` (`record`, `query`,
`session`): no public SDK method takes or returns a `sandbox._proto` message.

Times are seconds since the epoch (floats), as in `ExecutionResult`; durations keep the unit in
their name (``idle_timeout_ms``); enums are their lower-case names (``"active"``, ``"process"``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.result import ExecutionResult

__all__ = [
    "RUNNING",
    "ExecutionPage",
    "ExecutionQuery",
    "ExecutionRecord",
    "SessionInfo",
    "SessionState",
]

RUNNING = "running"  # an `ExecutionRecord`'s status before its execution has ended


class SessionState(enum.StrEnum):
    ACTIVE = "active"  # open: executions may run in it
    CLOSED = "closed"  # closed by the client or by the server stopping
    EXPIRED = "expired"  # idle timeout, lifetime or number of executions reached
    LOST = "lost"  # its sandbox died (out of memory, protocol violation, ...)
    UNSPECIFIED = "unspecified"


@dataclass(frozen=True)
class ExecutionRecord:
    """One execution as the audit store holds it."""

    execution_id: str
    # The result's status, or `RUNNING` while it runs (an interrupted one says "interrupted").
    status: str
    result: ExecutionResult | None  # None while it runs
    tenant: str = ""
    script: str = ""
    script_sha256: str = ""
    manifest_sha256: str = ""
    prev_hash: str = ""  # the tenant's previous record's hash, and this one's: the audit chain
    record_hash: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    replay_of: str = ""  # the execution this one replays, when it is a replay
    runtime: str = ""  # the runtime it ran in; empty for the standard library
    idempotency_key: str = ""  # the request's key (the SDK sets one per call); empty: none
    # Why it is `interrupted` with no result: its server stopped responding (named, with when
    # it was last seen), or it handed its session over. Empty otherwise.
    interrupted_reason: str = ""


@dataclass(frozen=True)
class ExecutionPage:
    records: list[ExecutionRecord]
    next_page_token: str = ""  # empty on the last page


@dataclass(frozen=True)
class ExecutionQuery:
    """Which records `list_executions` returns; every filter is optional."""

    since: float | None = None  # started at or after (seconds since the epoch)
    until: float | None = None  # started before
    status: str | None = None  # an `ExecutionStatus` value, or "running": not yet ended
    tool: str | None = None  # with a call to this tool (its original name)
    violation: str | None = None  # with a violation of this limit
    page_size: int | None = None  # at most this many (default 50, at most 1000)
    page_token: str = ""  # a previous page's `next_page_token`
    session_id: str = ""  # only this session's executions


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    state: SessionState
    end_reason: str = ""  # why it ended (empty while active), e.g. "idle: no execution for 600 s"
    backend: str = ""
    limits: dict[str, int] = field(default_factory=dict)  # whole-session limits, by field
    idle_timeout_ms: int = 0
    max_lifetime_ms: int = 0
    max_executions: int = 0
    execution_ids: list[str] = field(default_factory=list)  # oldest first
    running_execution_id: str = ""
    created_at: float = 0.0
    last_used_at: float = 0.0
    ended_at: float | None = None
    isolation: list[str] = field(default_factory=list)
    runtime: str = ""  # empty for the standard library

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "state": str(self.state),
            "end_reason": self.end_reason,
            "backend": self.backend,
            "limits": dict(self.limits),
            "idle_timeout_ms": self.idle_timeout_ms,
            "max_lifetime_ms": self.max_lifetime_ms,
            "max_executions": self.max_executions,
            "execution_ids": list(self.execution_ids),
            "running_execution_id": self.running_execution_id,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
            "ended_at": self.ended_at,
            "isolation": list(self.isolation),
            "runtime": self.runtime,
        }
