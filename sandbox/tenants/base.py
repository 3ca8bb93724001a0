"""The tenancy interface the server admits every request through.

`Tenancy.authenticate` turns gRPC metadata into a `Tenant` (raising `Unauthenticated`);
`Tenancy.admit` is an async context manager held for the execution's whole run, enforcing the
tenant's concurrency (bounded queue or immediate refusal) and rate, raising
`ResourceExhausted` with a retry-after hint. Without a tenants file the server uses
`single_tenant()`: one tenant, `default`, with the server's own limits and no key.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sandbox.backend_names import BACKEND_NAMES
from sandbox.limits import CEILINGS, DEFAULTS, ResolvedLimits

__all__ = ["Tenancy", "Tenant"]


@dataclass(frozen=True)
class Tenant:
    id: str
    defaults: ResolvedLimits = DEFAULTS
    ceilings: ResolvedLimits = CEILINGS
    ceiling_policy: Literal["clamp", "refuse"] = "clamp"
    max_concurrent: int = 8
    queue: int = 32  # requests that may wait beyond max_concurrent; 0 = refuse at once
    rate_per_minute: int = 600
    # Every backend, as a tenants file's default: a server offers only those it was started
    # with, so the single tenant of a server without a tenants file may use each of them.
    backends: frozenset[str] = frozenset(BACKEND_NAMES)
    tool_modes: frozenset[str] = frozenset({"echo", "mock", "host", "client"})
    script_policy: Literal["none", "restricted"] = "none"
    audit_retention_days: int = 30
    labels: Mapping[str, str] = field(default_factory=dict)
    # Runtimes (`sandbox.runtimes`) it may name besides the standard library; None: any.
    runtimes: frozenset[str] | None = None
    # Sessions (`sandbox.sessions`): allowed at all, how many open at once, and the ceilings
    # (and defaults) of their idle timeout and lifetime, in seconds.
    sessions_allowed: bool = True
    max_sessions: int = 4
    session_idle_timeout_s: int = 600
    session_max_lifetime_s: int = 3600
    # Rebuilding a session on another server (`sandbox.sessions.rebuild`): the most recorded
    # cells it replays and the most CPU seconds the replay may spend; above either the session
    # is lost, naming the bound.
    session_rebuild_max_cells: int = 200
    session_rebuild_max_cpu_s: int = 60


class Tenancy(Protocol):
    @property
    def requires_auth(self) -> bool: ...

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        """The caller's tenant from `authorization: Bearer <key>`; raises Unauthenticated."""

    def admit(self, tenant: Tenant) -> AbstractAsyncContextManager[None]:
        """Held while the execution runs; raises ResourceExhausted when over quota."""
