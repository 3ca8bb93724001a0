# ruff: noqa: S608  -- SQL here is assembled from constants; values are bound.
"""`GlobalQuotas`: a tenant's concurrency, queue and rate held across every server of a fleet.

With the PostgreSQL store, servers share one database, and a tenant's quota lives there instead
of in each server's memory, so three servers give a tenant its quota once, not three times.
There is no leader: every admission is one short transaction that locks the tenant's row in
``quota_tenants`` (``SELECT ... FOR UPDATE``), so admissions of one tenant are serialised
across the fleet while different tenants proceed in parallel.

- **Rate**: the tenant's row is a shared token bucket (``tokens``, ``refilled_at``), refilled at
  ``rate_per_minute / 60`` per second up to the burst, by the database's clock, so the servers'
  clocks never matter.
- **Concurrency and queue**: each admitted or waiting execution holds a *lease*, a row of
  ``quota_leases`` with an expiry. A lease is ``running`` (it counts against ``max_concurrent``)
  or ``queued`` (against ``queue``), and queued leases are served first come first served by
  their order number. A server renews all its leases every ``ttl / 3`` (the heartbeat) and
  deletes each when its execution ends; a server that crashes stops renewing, and its leases
  expire after ``ttl`` seconds, when the next admission of that tenant on any server deletes
  them. So a crashed server's slots come back within the expiry, without anyone in charge.
  A server restarted under the same instance id returns its predecessor's leases at once.
- **Waiting**: only the oldest local waiter of a tenant asks the database, at once when any
  server frees one of the tenant's leases (``NOTIFY``, which every server ``LISTEN``s for) and
  otherwise by polling from ``poll_s`` backing off to ``poll_max_s`` (the safety net for
  expired leases, which nobody announces); the others wait their turn locally.

If the database cannot be reached, admission fails with `Unavailable`; executions already running
go on, and their leases expire if the heartbeat cannot renew them for ``ttl`` seconds (the quota
is then briefly not enforced across the fleet; the log says so). The SQLite and in-memory stores
keep the per-server quotas of `sandbox.tenants.registry`. Tables are created on start (under an
advisory lock, idempotent); they hold only live state and are not part of the audit record.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sandbox.errors import InvalidArgument, ResourceExhausted, Unavailable
from sandbox.tenants.base import Tenancy, Tenant

__all__ = ["QUOTA_TABLES", "GlobalQuotas"]

log = logging.getLogger(__name__)
T = TypeVar("T")

QUEUE_FULL_RETRY_S = 1.0
_SCHEMA_LOCK = 0x70746371  # "ptcq": the advisory lock key that serialises table creation
_CHANNEL = "ptc_quota_freed"  # NOTIFY channel: a lease of the tenant named in the payload ended
_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"
QUOTA_TABLES = ("quota_leases", "quota_tenants")
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS quota_tenants (
        tenant TEXT PRIMARY KEY,
        tokens DOUBLE PRECISION NOT NULL,
        refilled_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS quota_leases (
        lease_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        owner TEXT NOT NULL,
        instance TEXT NOT NULL,
        state TEXT NOT NULL,
        queued_seq BIGINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS quota_leases_tenant ON quota_leases (tenant, state, queued_seq)",
    "CREATE INDEX IF NOT EXISTS quota_leases_owner ON quota_leases (owner)",
    "CREATE SEQUENCE IF NOT EXISTS quota_order",
)


@dataclass
class _Waiter:
    lease_id: str
    turn: asyncio.Event  # set when this waiter is the oldest local one of its tenant


class _Line:
    """One tenant's local waiters, oldest first; only the head polls the database."""

    def __init__(self) -> None:
        self.waiters: collections.deque[_Waiter] = collections.deque()
        self.kick = asyncio.Event()  # a local execution of the tenant ended: poll now


class GlobalQuotas:
    """A `Tenancy` whose admission is enforced in PostgreSQL for the whole fleet.

    Authentication is the wrapped tenancy's; ``burst`` gives a tenant's bucket size (None: the
    tenant has no rate limit, as with the single-tenant default).
    """

    def __init__(
        self,
        inner: Tenancy,
        url: str,
        *,
        burst: Callable[[Tenant], int | None],
        instance: str,
        lease_ttl_s: float = 15.0,
        poll_s: float = 0.05,
        poll_max_s: float = 1.0,
        connect_timeout_s: int = 10,
    ) -> None:
        if lease_ttl_s <= 0 or poll_s <= 0:
            raise InvalidArgument("quota_lease_ttl_s: must be positive")
        self.inner = inner
        self.url = url
        self.burst = burst
        # Unique per process: a lease names the server process that holds it.
        self.instance = instance
        self.owner = f"{instance}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.lease_ttl_s = lease_ttl_s
        self.poll_s = poll_s
        self.poll_max_s = max(poll_s, poll_max_s)
        self._timeout = connect_timeout_s
        self._conn: Any = None
        self._lock: asyncio.Lock | None = None
        self._lines: dict[str, _Line] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._cleanup: set[asyncio.Task[Any]] = set()
        # Set when close() begins: its last statement returns every lease of this instance, so
        # a lease released after that needs no task of its own (one made then outlived the
        # loop and its reconnection leaked), and nothing reconnects once it has disconnected.
        self._closing = False

    # -- Tenancy ---------------------------------------------------------------------------

    @property
    def requires_auth(self) -> bool:
        return self.inner.requires_auth

    def authenticate(self, metadata: Mapping[str, str]) -> Tenant:
        return self.inner.authenticate(metadata)

    def admit(self, tenant: Tenant) -> AbstractAsyncContextManager[None]:
        return self._admit(tenant)

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Connects, creates the tables if needed and starts the heartbeat."""
        self._lock = asyncio.Lock()
        await self._run(self._create_tables)
        reclaimed = await self._run(self._reclaim, single=True)
        if reclaimed:
            log.warning(
                "quota: returned %d leases an earlier run of instance %r left behind",
                reclaimed,
                self.instance,
            )
        self._heartbeat = asyncio.create_task(self._renew_forever())
        self._listener = asyncio.create_task(self._listen_forever())

    async def close(self) -> None:
        """Stops the heartbeat, returns this server's leases and disconnects."""
        self._closing = True
        for task in (self._heartbeat, self._listener):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._heartbeat = self._listener = None
        if self._cleanup:
            await asyncio.gather(*self._cleanup, return_exceptions=True)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._run(self._drop_own, single=True)
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None

    # -- admission -------------------------------------------------------------------------

    @asynccontextmanager
    async def _admit(self, tenant: Tenant) -> AsyncIterator[None]:
        lease_id = uuid.uuid4().hex
        try:
            state, seq = await self._finish(self._run(lambda c: self._enter(c, tenant, lease_id)))
        except asyncio.CancelledError:
            self._release(tenant, lease_id)  # the lease may have been written: return it
            raise
        try:
            if state == "queued":
                await self._wait_turn(tenant, lease_id, seq)
            yield
        finally:
            self._release(tenant, lease_id)

    async def _finish(self, awaitable: Awaitable[T]) -> T:
        """Runs a database step to its end even if the caller is cancelled meanwhile, so a
        transaction is never abandoned halfway; the cancellation is re-raised afterwards."""
        task = asyncio.ensure_future(awaitable)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await task
            raise

    async def _wait_turn(self, tenant: Tenant, lease_id: str, seq: int) -> None:
        line = self._lines.setdefault(tenant.id, _Line())
        me = _Waiter(lease_id, asyncio.Event())
        line.waiters.append(me)
        if line.waiters[0] is me:
            me.turn.set()
        try:
            await me.turn.wait()
            pause = self.poll_s
            while True:
                line.kick.clear()
                promoted = await self._finish(
                    self._run(lambda c: self._promote(c, tenant, lease_id, seq))
                )
                if promoted:
                    return
                # A release anywhere in the fleet kicks at once (NOTIFY); the poll, slower
                # while nothing changes, is the safety net for expiries and lost notices.
                try:
                    await asyncio.wait_for(line.kick.wait(), pause)
                    pause = self.poll_s
                except TimeoutError:
                    pause = min(self.poll_max_s, pause * 2)
        finally:
            line.waiters.remove(me)
            if line.waiters:
                line.waiters[0].turn.set()
            elif self._lines.get(tenant.id) is line:
                del self._lines[tenant.id]

    def _release(self, tenant: Tenant, lease_id: str) -> None:
        """Deletes the lease in the background (also when the caller is being cancelled) and
        wakes the tenant's oldest local waiter."""
        if self._closing:
            return  # returned with every other lease of this instance by close()

        async def release() -> None:
            try:
                await self._run(lambda c: self._delete(c, lease_id), single=True)
            except Unavailable as exc:
                log.warning(
                    "quota: cannot return lease %s (it expires on its own): %s", lease_id, exc
                )
            line = self._lines.get(tenant.id)
            if line is not None:
                line.kick.set()

        task = asyncio.create_task(release())
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    # -- database steps (each one transaction) ---------------------------------------------

    async def _run(self, step: Callable[[Any], Awaitable[T]], *, single: bool = False) -> T:
        """Runs ``step`` in one transaction; ``single``: a one-statement step, which autocommit
        makes atomic without the BEGIN and COMMIT round trips."""
        import psycopg

        assert self._lock is not None, "GlobalQuotas.start() was not called"
        async with self._lock:
            try:
                if self._closing and self._conn is None:
                    raise Unavailable("global quotas: closed (this server is stopping)")
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = await psycopg.AsyncConnection.connect(
                        self.url, autocommit=True, connect_timeout=self._timeout
                    )
                if single:
                    return await step(self._conn)
                async with self._conn.transaction():
                    return await step(self._conn)
            except psycopg.Error as exc:
                raise Unavailable(f"global quotas: PostgreSQL failed: {exc}") from exc

    async def _create_tables(self, conn: Any) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        for statement in _SCHEMA:
            await conn.execute(statement)

    async def _lock_tenant(self, conn: Any, tenant: Tenant) -> tuple[float, float, float]:
        """Locks the tenant's row, creating it with a full bucket (one statement: the upsert
        takes the row lock either way). Returns (tokens, refilled_at, now), the database's
        clock."""
        burst = self.burst(tenant) or 0
        cursor = await conn.execute(
            f"INSERT INTO quota_tenants (tenant, tokens, refilled_at) VALUES (%s, %s, {_NOW}) "
            "ON CONFLICT (tenant) DO UPDATE SET tenant = excluded.tenant "
            f"RETURNING tokens, refilled_at, {_NOW}",
            (tenant.id, float(burst)),
        )
        tokens, refilled_at, now = await cursor.fetchone()
        return float(tokens), float(refilled_at), float(now)

    async def _counts(self, conn: Any, tenant: Tenant, now: float) -> tuple[int, int]:
        """Live (running, queued) leases of the tenant; deletes expired ones when there are."""
        cursor = await conn.execute(
            "SELECT COUNT(*) FILTER (WHERE state = 'running' AND expires_at >= %s), "
            "COUNT(*) FILTER (WHERE state = 'queued' AND expires_at >= %s), "
            "COUNT(*) FILTER (WHERE expires_at < %s) FROM quota_leases WHERE tenant = %s",
            (now, now, now, tenant.id),
        )
        running, queued, expired = await cursor.fetchone()
        if expired:
            await conn.execute(
                "DELETE FROM quota_leases WHERE tenant = %s AND expires_at < %s", (tenant.id, now)
            )
        return int(running), int(queued)

    async def _enter(self, conn: Any, tenant: Tenant, lease_id: str) -> tuple[str, int]:
        """Takes a token and a running or queued lease; returns its state and its place in the
        fleet's queue; raises ResourceExhausted."""
        tokens, refilled_at, now = await self._lock_tenant(conn, tenant)
        burst = self.burst(tenant)
        if burst is not None:
            rate_per_s = tenant.rate_per_minute / 60.0
            tokens = min(float(burst), tokens + max(0.0, now - refilled_at) * rate_per_s)
            if tokens < 1.0:
                await conn.execute(
                    "UPDATE quota_tenants SET tokens = %s, refilled_at = %s WHERE tenant = %s",
                    (tokens, now, tenant.id),
                )
                retry_after = (1.0 - tokens) / rate_per_s
                raise ResourceExhausted(
                    f"tenant {tenant.id}: rate limit of {tenant.rate_per_minute} executions per "
                    f"minute reached across the fleet; retry in {retry_after:.1f} s",
                    retry_after_s=retry_after,
                )
        running, queued = await self._counts(conn, tenant, now)
        if running < tenant.max_concurrent and queued == 0:
            state = "running"
        elif queued < tenant.queue:
            state = "queued"
        else:
            raise ResourceExhausted(
                f"tenant {tenant.id}: {running} executions running across the fleet (the "
                f"maximum) and {queued} waiting (the queue is full)",
                retry_after_s=QUEUE_FULL_RETRY_S,
            )
        # The token and the lease in one statement (one round trip fewer per admission).
        cursor = await conn.execute(
            "WITH spent AS (UPDATE quota_tenants SET tokens = %s, refilled_at = %s "
            "WHERE tenant = %s AND %s) "
            "INSERT INTO quota_leases (lease_id, tenant, owner, instance, state, queued_seq, "
            "expires_at) VALUES (%s, %s, %s, %s, %s, nextval('quota_order'), %s) "
            "RETURNING queued_seq",
            (
                tokens - 1.0,
                now,
                tenant.id,
                burst is not None,
                lease_id,
                tenant.id,
                self.owner,
                self.instance,
                state,
                now + self.lease_ttl_s,
            ),
        )
        (seq,) = await cursor.fetchone()
        return state, int(seq)

    async def _promote(self, conn: Any, tenant: Tenant, lease_id: str, seq: int) -> bool:
        """Turns the queued lease into a running one if a slot is free and it is the oldest."""
        _tokens, _refilled_at, now = await self._lock_tenant(conn, tenant)
        running, _queued = await self._counts(conn, tenant, now)
        cursor = await conn.execute(
            "SELECT lease_id FROM quota_leases WHERE tenant = %s AND state = 'queued' "
            "ORDER BY queued_seq LIMIT 1",
            (tenant.id,),
        )
        oldest = await cursor.fetchone()
        if oldest is None or oldest[0] != lease_id:
            mine = await conn.execute("SELECT 1 FROM quota_leases WHERE lease_id = %s", (lease_id,))
            if await mine.fetchone() is None:
                # Expired while the heartbeat could not renew it: queue again, in the same place
                # (so this server's waiters stay in the order only its oldest one polls in).
                await conn.execute(
                    "INSERT INTO quota_leases (lease_id, tenant, owner, instance, state, "
                    "queued_seq, expires_at) VALUES (%s, %s, %s, %s, 'queued', %s, %s)",
                    (lease_id, tenant.id, self.owner, self.instance, seq, now + self.lease_ttl_s),
                )
            return False
        if running >= tenant.max_concurrent:
            return False
        await conn.execute(
            "UPDATE quota_leases SET state = 'running', expires_at = %s WHERE lease_id = %s",
            (now + self.lease_ttl_s, lease_id),
        )
        return True

    async def _reclaim(self, conn: Any) -> int:
        """Deletes leases an earlier process of this instance id left (it crashed, since a
        clean stop deletes its own): its slots return now rather than at expiry. Instance
        ids must be distinct across live servers, as the audit store's `mark_interrupted`
        already requires."""
        cursor = await conn.execute(
            "DELETE FROM quota_leases WHERE instance = %s AND owner <> %s",
            (self.instance, self.owner),
        )
        return int(cursor.rowcount)

    async def _delete(self, conn: Any, lease_id: str) -> None:
        """Deletes the lease and tells every server (a notice on `_CHANNEL` naming the tenant,
        sent when the statement commits) that a slot or a place in the queue is free."""
        await conn.execute(
            "WITH gone AS (DELETE FROM quota_leases WHERE lease_id = %s RETURNING tenant) "
            f"SELECT pg_notify('{_CHANNEL}', tenant) FROM gone",
            (lease_id,),
        )

    async def _drop_own(self, conn: Any) -> None:
        await conn.execute("DELETE FROM quota_leases WHERE owner = %s", (self.owner,))

    async def _renew(self, conn: Any) -> int:
        cursor = await conn.execute(
            f"UPDATE quota_leases SET expires_at = {_NOW} + %s WHERE owner = %s",
            (self.lease_ttl_s, self.owner),
        )
        return int(cursor.rowcount)

    async def _listen_forever(self) -> None:
        """Wakes the oldest local waiter of a tenant whenever any server frees one of its
        leases; reconnects after a failure (the waiters' polling covers the gap)."""
        import psycopg

        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=self._timeout
                )
                try:
                    await conn.execute(f"LISTEN {_CHANNEL}")
                    async for notice in conn.notifies():
                        line = self._lines.get(notice.payload)
                        if line is not None:
                            line.kick.set()
                finally:
                    await conn.close()
            except psycopg.Error as exc:
                log.warning("quota: not listening for freed slots (waiters poll): %s", exc)
                await asyncio.sleep(self.poll_max_s)

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            try:
                await self._run(self._renew, single=True)
            except Unavailable as exc:
                log.warning(
                    "quota: cannot renew this server's leases; they expire in %.0f s and the "
                    "fleet's quota then no longer counts them: %s",
                    self.lease_ttl_s,
                    exc,
                )
