"""`TenantRegistry`: the `Tenancy` of a tenants file — authentication, concurrency and rate.

Each tenant has its own gate: a token bucket for its rate, a count of running executions and a
bounded FIFO queue of waiters. Gates share nothing, so one tenant's flood fills only its own
queue and bucket and never delays another tenant. Within a tenant, a freed slot passes straight
to the oldest waiter (no barging), and a waiter that gives up (its task is cancelled) leaves the
queue or, if a slot was already handed to it, passes the slot on. Everything runs on the
server's event loop without awaiting between reads and writes of a gate, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from sandbox.errors import ResourceExhausted, Unauthenticated
from sandbox.tenants.base import Tenant
from sandbox.tenants.config import TenantConfig, TenantsFile, load_tenants
from sandbox.tenants.keys import KeyHash

__all__ = ["TenantRegistry", "load_tenancy"]

QUEUE_FULL_RETRY_S = 1.0
_CACHE_LIMIT = 4096


class _Gate:
    """One tenant's quota: token bucket + concurrency slots + bounded FIFO queue."""

    def __init__(self, tenant: Tenant, burst: int, clock: Callable[[], float]) -> None:
        self.tenant = tenant
        self.burst = float(burst)
        self.tokens = float(burst)
        self.clock = clock
        self.updated = clock()
        self.running = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take_token(self) -> float | None:
        """Takes one token; returns None, or the seconds until one will be available."""
        now = self.clock()
        rate_per_s = self.tenant.rate_per_minute / 60.0
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * rate_per_s)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / rate_per_s

    def refund_token(self) -> None:
        self.tokens = min(self.burst, self.tokens + 1.0)

    async def acquire(self) -> None:
        if self.running < self.tenant.max_concurrent and not self.waiters:
            self.running += 1
            return
        if len(self.waiters) >= self.tenant.queue:
            raise ResourceExhausted(
                f"tenant {self.tenant.id}: {self.running} executions running (the maximum) and "
                f"{len(self.waiters)} waiting (the queue is full)",
                retry_after_s=QUEUE_FULL_RETRY_S,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over just as we gave up: pass it on
            else:
                with contextlib.suppress(ValueError):  # release() may have dropped it already
                    self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the waiter; running is unchanged
                return
        self.running -= 1


class TenantRegistry:
    """Tenancy over a validated tenants file; every request must authenticate."""

    def __init__(self, tenants: TenantsFile, clock: Callable[[], float] = time.monotonic) -> None:
        self.file = tenants
        self._clock = clock
        self._configs: dict[str, TenantConfig] = {c.tenant.id: c for c in tenants.tenants}
        self._keys: list[tuple[KeyHash, Tenant]] = [
            (key, c.tenant) for c in tenants.tenants for key in c.keys
        ]
        self._accepted: dict[str, Tenant] = {}  # sha256 of keys already checked by scrypt
        self._gates: dict[str, _Gate] = {}

    @property
    def requires_auth(self) -> bool:
        return True

    @property
    def tenants(self) -> list[Tenant]:
        return [c.tenant for c in self._configs.values()]

    def tenant(self, tenant_id: str) -> Tenant | None:
        config = self._configs.get(tenant_id)
        return config.tenant if config else None

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        header = next((v for k, v in metadata.items() if k.lower() == "authorization"), None)
        if header is None:
            raise Unauthenticated("missing metadata 'authorization: Bearer <API key>'")
        scheme, _, key = header.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthenticated("the authorization metadata must be 'Bearer <API key>'")
        fingerprint = hashlib.sha256(key.encode("utf-8")).hexdigest()
        cached = self._accepted.get(fingerprint)
        if cached is not None:
            return cached
        found: Tenant | None = None
        for key_hash, tenant in self._keys:
            # Every hash is compared (in constant time each), whichever one matches.
            if key_hash.matches(key) and found is None:
                found = tenant
        if found is None:
            raise Unauthenticated("unknown API key")
        if len(self._accepted) < _CACHE_LIMIT:
            self._accepted[fingerprint] = found
        return found

    def _gate(self, tenant: Tenant) -> _Gate:
        gate = self._gates.get(tenant.id)
        if gate is None:
            config = self._configs.get(tenant.id)
            burst = config.rate_burst if config else tenant.rate_per_minute
            gate = self._gates[tenant.id] = _Gate(tenant, burst, self._clock)
        return gate

    def admit(self, tenant: Tenant) -> AbstractAsyncContextManager[None]:
        return self._admit(tenant)

    @asynccontextmanager
    async def _admit(self, tenant: Tenant) -> AsyncIterator[None]:
        gate = self._gate(tenant)
        retry_after = gate.take_token()
        if retry_after is not None:
            raise ResourceExhausted(
                f"tenant {tenant.id}: rate limit of {tenant.rate_per_minute} executions per "
                f"minute reached; retry in {retry_after:.1f} s",
                retry_after_s=retry_after,
            )
        try:
            await gate.acquire()
        except ResourceExhausted:
            gate.refund_token()
            raise
        try:
            yield
        finally:
            gate.release()

    def stats(self, tenant_id: str) -> tuple[int, int]:
        """(running, waiting) for a tenant; for health pages and tests."""
        gate = self._gates.get(tenant_id)
        return (gate.running, len(gate.waiters)) if gate else (0, 0)


def load_tenancy(path: str | Path, clock: Callable[[], float] = time.monotonic) -> TenantRegistry:
    """The `Tenancy` for the tenants file at ``path`` (raises `TenantConfigError`)."""
    return TenantRegistry(load_tenants(path), clock=clock)
