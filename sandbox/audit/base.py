"""The audit store's interface, which the server writes through and queries.

Crash safety is part of the contract: `admit` is durable before the script runs, `complete`
finishes the same record when the execution ends, and a restart marks records that were
admitted but never completed as `interrupted`. Records are chained per tenant (each carries the
hash of the tenant's previous record) so that an edit, deletion or reordering is detected by
`verify`.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from sandbox.errors import FailedPrecondition, quote
from sandbox.expectations import ExpectedCalls
from sandbox.limits import ResolvedLimits
from sandbox.result import ExecutionResult

__all__ = [
    "Admission",
    "AuditQuery",
    "AuditRecord",
    "AuditStore",
    "DeadServer",
    "Holder",
    "KeyTaken",
    "Member",
    "SessionHolding",
    "SessionRecord",
    "SessionRows",
    "VerifyReport",
]


@dataclass(frozen=True)
class Admission:
    """What is known when an execution is admitted, before it runs."""

    execution_id: str
    tenant: str
    script: str
    manifest_json: str
    manifest_sha256: str
    backend: str
    policy: str
    # None on an entry written before every limit was recorded by field: its entry keeps them as
    # written (`ResolvedLimits.from_record`).
    effective_limits: ResolvedLimits | None
    labels: Mapping[str, str] = field(default_factory=dict)
    admitted_at: float = 0.0
    # What a replay needs beyond the above (`sandbox.replay`). None: a record written before
    # expected calls were recorded, which cannot be replayed faithfully.
    expected_calls: tuple[ExpectedCalls, ...] | None = None
    # The execution this one replays ("" for an ordinary execution); set only by the replay.
    replay_of: str = ""
    # The runtime it ran in (`sandbox.runtimes`); "" for the standard library, and in records
    # written before runtimes were recorded. Part of what ran, so part of what a replay runs.
    runtime: str = ""
    # The request's idempotency key ("" for none): at most one admission per tenant and key.
    idempotency_key: str = ""


class KeyTaken(FailedPrecondition):
    """`admit` found the tenant's idempotency key already admitted (by this server or another):
    nothing was admitted; the caller answers with ``execution_id``'s result instead. Should it
    ever reach a client, it is FAILED_PRECONDITION naming the key."""

    def __init__(self, key: str, execution_id: str) -> None:
        super().__init__(
            f"idempotency_key: {quote(key)} was already admitted as execution {execution_id}"
        )
        self.key = key
        self.execution_id = execution_id


@dataclass(frozen=True)
class AuditRecord:
    admission: Admission
    result: ExecutionResult | None  # None while running (or after an interrupted run)
    status: str  # running | interrupted | one of ExecutionStatus
    prev_hash: str
    record_hash: str
    script_sha256: str
    # Why it is `interrupted`, as the server that marked it wrote it (None otherwise).
    interrupted_reason: str | None = None


@dataclass(frozen=True)
class AuditQuery:
    since: float | None = None
    until: float | None = None
    status: str | None = None
    tool: str | None = None
    violation: str | None = None
    limit: int = 50
    page_token: str | None = None
    session_id: str | None = None  # only the executions of this session (`sandbox.sessions`)


@dataclass(frozen=True)
class DeadServer:
    """A server that stopped renewing its lease, as a survivor found it."""

    instance: str
    address: str
    last_seen: float  # epoch seconds of its last heartbeat
    interrupted: int  # its running records this sweep marked `interrupted`


@dataclass(frozen=True)
class Member:
    """A server of the fleet sharing the store, as its lease row says."""

    instance: str
    address: str  # where the others reach it (`ptc serve --advertise`)
    alive: bool  # its lease has not expired


@dataclass(frozen=True)
class Holder(Member):
    """The server that admitted a session still open in the record (status `running`)."""


@dataclass(frozen=True)
class SessionRecord:
    """A session as the store's ``sessions`` row holds it (`sandbox.audit._sessions`)."""

    tenant: str
    session_id: str
    state: str  # active | closed | expired | lost
    end_reason: str  # why it ended ("" while active)
    holder: str  # the instance that admitted it or last took it over
    backend: str
    runtime: str
    created_at: float
    ended_at: float | None
    idle_timeout_ms: int
    max_lifetime_ms: int
    max_executions: int

    @property
    def ended(self) -> bool:
        return self.state != "active"


@dataclass(frozen=True)
class VerifyReport:
    tenant: str | None
    records: int
    problems: Sequence[str]  # each names the record and what is wrong

    @property
    def ok(self) -> bool:
        return not self.problems


class AuditStore(Protocol):
    """What the server writes through and reads, with what it may ask of a store's kind as
    typed members (`quick_reads`, `holds_sessions`) rather than by probing for attributes."""

    @property
    def instance(self) -> str:
        """This server's name in the store (and the fleet)."""

    @property
    def quick_reads(self) -> bool:
        """Whether a short read (`by_key`) may run on the event loop: a local file or memory."""

    @property
    def holds_sessions(self) -> bool:
        """Whether open session records can move between servers (`SessionHolding`)."""

    def write_probe(self, pad_bytes: int = 0) -> None:
        """A write like an append's, recording nothing: raises `StoreUnavailable` while the
        store refuses writes."""

    def schema_version(self) -> int:
        """The applied schema version: a cheap read that says the store answers."""

    def find(self, execution_id: str) -> AuditRecord | None:
        """A record by id whatever its tenant (the operator's view)."""

    def admit(self, admission: Admission) -> None:
        """Durably records an admitted execution (status `running`); with an idempotency key,
        in the same transaction maps (tenant, key) to it, or raises `KeyTaken` and admits
        nothing when the key is already mapped."""

    def by_key(self, tenant: str, key: str) -> str | None:
        """The execution admitted under the tenant's idempotency key, or None."""

    def complete(self, execution_id: str, result: ExecutionResult) -> None:
        """Completes the record with the result and every call."""

    def get(self, tenant: str, execution_id: str) -> AuditRecord | None:
        """The tenant's record, or None (also for another tenant's id)."""

    def list(self, tenant: str, query: AuditQuery) -> tuple[list[AuditRecord], str | None]:
        """Newest first; returns the page and the next page token."""

    def mark_interrupted(self) -> int:
        """At start-up: records still `running` become `interrupted`; returns how many."""

    def heartbeat(self, address: str, ttl_s: float) -> None:
        """Says this server is alive (and where it listens) for ``ttl_s`` more seconds."""

    def leave(self) -> None:
        """This server stops cleanly: it is no member of the fleet any more."""

    def sweep_dead(self) -> builtins.list[DeadServer]:
        """Servers whose lease expired: their running records become `interrupted`, naming
        them and when they were last seen; each dead server is swept by one survivor only."""

    def holder(self, tenant: str, session_id: str) -> Holder | None:
        """The server holding the tenant's open session, whether its lease is alive; None when
        no open session has that id, or the holder left the fleet."""

    def members(self) -> builtins.list[Member]:
        """The fleet's other servers whose lease is alive."""

    def fleet_secret(self) -> str:
        """The fleet's shared secret, created once at random by the first server to ask."""

    def verify(self, tenant: str | None = None) -> VerifyReport:
        """Checks the hash chain of one tenant, or of all."""

    def close(self) -> None: ...


@runtime_checkable
class SessionHolding(Protocol):
    """A store whose open session records can move from one server to another (the SQL stores;
    `sandbox.sessions.rebuild`): a draining server hands its sessions over, and a server that
    rebuilds one takes it over, exactly one of them (a compare-and-set on the holder)."""

    def hand_over(self, execution_id: str, reason: str) -> bool:
        """Marks this server's open session record `interrupted` (handed over, not ended)."""

    def take_over(self, tenant: str, execution_id: str) -> str | None:
        """Makes this server the holder of an open session record whose holder let go of it
        or died; returns the previous holder, or None when it cannot be taken."""


@runtime_checkable
class SessionRows(Protocol):
    """A store that keeps each session as a typed row (the SQL stores), so that any server
    says what became of a session, also one that ended elsewhere or before a restart."""

    def session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The tenant's session row, or None (unknown, another tenant's, or pruned)."""
