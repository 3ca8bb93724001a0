"""Global quotas through two in-process servers sharing a real PostgreSQL schema.

The servers run the real gRPC stack, tenancy, audit store and `GlobalQuotas`; only the sandbox is
the `FakeBackend` (a script that waits on a gate holds its slot for as long as the test likes).
The flood, rate and crash cases with real `ptc serve` processes are in
tests/server/test_fleet.py. Skipped, and says so, without ``PTC_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psycopg
import pytest

from sandbox.backends.fake import FakeBackend
from sandbox.client import Client
from sandbox.engine import Engine, EngineConfig
from sandbox.errors import PtcError, ResourceExhausted
from sandbox.server import SandboxServer, ServerConfig
from sandbox.tenants import hash_key, load_tenancy
from sandbox.tenants.global_quota import GlobalQuotas

T = TypeVar("T")
KEY = "ptc-test-key-global-quota-0123456789"
TENANTS = f"""
[[tenant]]
id = "q"
keys = ["{hash_key(KEY)}"]
max_concurrent = 1
queue = 1
rate_per_minute = 6000
"""

pytestmark = pytest.mark.requires_postgres


class Server:
    def __init__(self, url: str, tenants: Path, instance: str) -> None:
        self.backend = FakeBackend()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = SandboxServer(
            ServerConfig(
                listen="127.0.0.1:0",
                tenants=str(tenants),
                audit_db=url,
                instance_id=instance,
                quota_lease_ttl_s=3.0,
                shutdown_grace_s=2.0,
            ),
            engine=Engine(EngineConfig(backends={"process": self.backend})),
        )
        self.address = self.call(self.server.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(30)

    def close(self) -> None:
        self.backend.gate("go").set()
        self.call(self.server.stop(grace_s=2.0))
        self.close_loop()

    def close_loop(self) -> None:
        """Stops and closes the loop (its self-pipe sockets with it), whether or not the
        server was stopped already."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def pair(pg_url: str, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    a = Server(pg_url, tenants, "quota-a")
    try:
        b = Server(pg_url, tenants, "quota-b")
    except BaseException:
        a.close()
        raise
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def leases(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT owner, state FROM quota_leases ORDER BY queued_seq").fetchall()
    return [(str(owner).split("/")[0], str(state)) for owner, state in rows]


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_server_uses_global_quotas_and_says_so(pair: tuple[Server, Server]) -> None:
    a, b = pair
    assert isinstance(a.server.tenancy, GlobalQuotas)
    assert isinstance(b.server.tenancy, GlobalQuotas)


def test_a_queue_and_a_slot_shared_by_two_servers(pair: tuple[Server, Server], pg_url: str) -> None:
    a, b = pair
    with Client(a.address, api_key=KEY) as ca, Client(b.address, api_key=KEY) as cb:
        with ThreadPoolExecutor(2) as pool:
            holder = pool.submit(ca.execute, 'wait("go")\nprint("held")', timeout=30)
            wait_for(lambda: leases(pg_url) == [("quota-a", "running")], "a holds the slot")
            queued = pool.submit(cb.execute, 'print("queued")', timeout=30)
            wait_for(
                lambda: leases(pg_url) == [("quota-a", "running"), ("quota-b", "queued")],
                "b's request waits in the fleet's queue",
            )
            with pytest.raises(ResourceExhausted) as refused:
                ca.execute('print("third")', timeout=30)
            assert str(refused.value) == (
                "tenant q: 1 executions running across the fleet (the maximum) and 1 waiting "
                "(the queue is full)"
            )
            assert refused.value.retry_after_s == 1.0
            a.backend.gate("go").set()
            assert (holder.result(30).status, holder.result().stdout) == ("ok", "held\n")
            assert (queued.result(30).status, queued.result().stdout) == ("ok", "queued\n")
        # both servers still serve, and no lease is left behind
        assert ca.execute('print("after")', timeout=30).stdout == "after\n"
    wait_for(lambda: leases(pg_url) == [], "every lease is returned")


def test_a_waiter_that_gives_up_returns_its_lease(pair: tuple[Server, Server], pg_url: str) -> None:
    a, b = pair
    with Client(a.address, api_key=KEY) as ca, Client(b.address, api_key=KEY) as cb:
        with ThreadPoolExecutor(1) as pool:
            holder = pool.submit(ca.execute, 'wait("go")', timeout=30)
            wait_for(lambda: leases(pg_url) == [("quota-a", "running")], "a holds the slot")
            with pytest.raises(PtcError) as gave_up:
                cb.execute('print("never")', timeout=1.0)
            assert gave_up.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            # The request leaves the fleet's queue at once (its lease is deleted), and nothing
            # was admitted for it.
            wait_for(lambda: leases(pg_url) == [("quota-a", "running")], "b's lease is gone")
            a.backend.gate("go").set()
            assert holder.result(30).status == "ok"
            wait_for(lambda: leases(pg_url) == [], "a's lease is returned")
            assert b.backend.started == 0
        assert cb.execute('print("now")', timeout=30).stdout == "now\n"
    wait_for(lambda: leases(pg_url) == [], "every lease is returned")


def test_sqlite_keeps_per_instance_quotas_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    with caplog.at_level(logging.WARNING, logger="sandbox.server.fleet"):
        server = SandboxServer(
            ServerConfig(tenants=str(tenants), audit_db=str(tmp_path / "audit.db")),
            engine=Engine(EngineConfig(backends={"process": FakeBackend()})),
        )
    try:
        assert not isinstance(server.tenancy, GlobalQuotas)
        assert caplog.messages == [
            "quotas: per instance (the SQLite audit store is not shared): each server enforces "
            "a tenant's concurrency, queue and rate on its own"
        ]
    finally:
        server.store.close()


def test_a_restart_under_the_same_instance_id_returns_its_leases_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    """A server that died holding slots (its process gone, its leases left in the database) is
    started again with the same instance id: the slots return at its start, not at expiry."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    registry = load_tenancy(tenants)
    tenant = registry.tenant("q")
    assert tenant is not None

    async def scenario() -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
        first = GlobalQuotas(
            registry, pg_url, burst=lambda t: 100, instance="crashy", lease_ttl_s=60
        )
        other = GlobalQuotas(registry, pg_url, burst=lambda t: 100, instance="crashy-2")
        await first.start()
        await other.start()
        held = first.admit(tenant)
        await held.__aenter__()  # holds the only slot; its process then "dies" (below)
        assert first._heartbeat is not None
        first._heartbeat.cancel()
        await first._conn.close()  # gone without returning anything
        before = leases(pg_url)
        second = GlobalQuotas(
            registry, pg_url, burst=lambda t: 100, instance="crashy", lease_ttl_s=60
        )
        await second.start()
        after = leases(pg_url)
        seen = []
        async with second.admit(tenant):
            seen.append("admitted")
        await second.close()
        await other.close()
        return before, after, seen

    with caplog_for("sandbox.tenants.global_quota") as messages:
        before, after, seen = asyncio.run(scenario())
    assert before == [("crashy", "running")]
    assert after == []
    assert seen == ["admitted"]
    assert messages == ["quota: returned 1 leases an earlier run of instance 'crashy' left behind"]


@contextlib.contextmanager
def caplog_for(logger: str) -> Iterator[list[str]]:
    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = _Keep(logging.WARNING)
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield messages
    finally:
        target.removeHandler(handler)


def test_a_draining_server_does_not_wait_for_another_servers_slot(
    pg_url: str, tmp_path: Path
) -> None:
    """b's request waits in the fleet's queue behind a's long run; b is stopped: after its grace
    the request leaves the queue (ends `cancelled`, nothing admitted) and b stops, while a's run
    goes on."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    a = Server(pg_url, tenants, "quota-a")
    b = Server(pg_url, tenants, "quota-b")
    stopped = False
    try:
        with (
            Client(a.address, api_key=KEY) as ca,
            Client(b.address, api_key=KEY) as cb,
            ThreadPoolExecutor(2) as pool,
        ):
            holder = pool.submit(ca.execute, 'wait("go")', timeout=60)
            wait_for(lambda: leases(pg_url) == [("quota-a", "running")], "a holds the slot")
            queued = pool.submit(cb.execute, 'print("queued")', timeout=60)
            wait_for(
                lambda: leases(pg_url) == [("quota-a", "running"), ("quota-b", "queued")],
                "b's request is queued",
            )
            b.call(b.server.stop(grace_s=0.5))
            stopped = True
            result = queued.result(30)
            assert (result.status, result.stdout) == ("cancelled", "")
            assert b.backend.started == 0
            assert leases(pg_url) == [("quota-a", "running")]
            assert not holder.done()
            a.backend.gate("go").set()
            assert holder.result(30).status == "ok"
    finally:
        if stopped:
            b.close_loop()
        else:
            b.close()
        a.close()
    wait_for(lambda: leases(pg_url) == [], "every lease is returned")


def test_a_queued_lease_lost_meanwhile_is_queued_again_in_its_place(
    pair: tuple[Server, Server], pg_url: str
) -> None:
    """As if b's heartbeat had failed for the lease expiry: its queued lease disappears from the
    database; b's waiter puts it back with the same place in the queue, and still gets the
    slot when a's run ends."""
    a, b = pair

    def queued_seqs() -> list[int]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT queued_seq FROM quota_leases WHERE state = 'queued'"
            ).fetchall()
        return [int(r[0]) for r in rows]

    with (
        Client(a.address, api_key=KEY) as ca,
        Client(b.address, api_key=KEY) as cb,
        ThreadPoolExecutor(2) as pool,
    ):
        holder = pool.submit(ca.execute, 'wait("go")', timeout=30)
        wait_for(lambda: leases(pg_url) == [("quota-a", "running")], "a holds the slot")
        queued = pool.submit(cb.execute, 'print("queued")', timeout=30)
        wait_for(lambda: len(queued_seqs()) == 1, "b's request is queued")
        (place,) = queued_seqs()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM quota_leases WHERE state = 'queued'")
        wait_for(lambda: queued_seqs() == [place], "b queued it again, in the same place")
        a.backend.gate("go").set()
        assert holder.result(30).status == "ok"
        assert (queued.result(30).status, queued.result().stdout) == ("ok", "queued\n")
    wait_for(lambda: leases(pg_url) == [], "every lease is returned")


def test_a_release_on_one_server_wakes_a_waiter_on_another(pg_url: str, tmp_path: Path) -> None:
    """With polling slowed to once a minute, only the NOTIFY a release sends can wake the other
    server's waiter in time: it gets the slot long before its next poll."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    registry = load_tenancy(tenants)
    tenant = registry.tenant("q")
    assert tenant is not None

    async def scenario() -> list[str]:
        kwargs: dict[str, Any] = {"burst": lambda t: 100, "poll_s": 60.0, "poll_max_s": 60.0}
        first = GlobalQuotas(registry, pg_url, instance="notify-a", **kwargs)
        second = GlobalQuotas(registry, pg_url, instance="notify-b", **kwargs)
        await first.start()
        await second.start()
        events: list[str] = []
        try:
            held = first.admit(tenant)
            await held.__aenter__()

            async def wait_for_slot() -> None:
                async with second.admit(tenant):
                    events.append("second admitted")

            waiter = asyncio.create_task(wait_for_slot())
            while leases(pg_url) != [("notify-a", "running"), ("notify-b", "queued")]:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # the waiter's first poll is done; the next is a minute away
            events.append("first releases")
            await held.__aexit__(None, None, None)
            await asyncio.wait_for(waiter, 20)
        finally:
            await first.close()
            await second.close()
        return events

    assert asyncio.run(scenario()) == ["first releases", "second admitted"]
    assert leases(pg_url) == []


def test_a_run_longer_than_the_lease_ttl_keeps_its_slot(pg_url: str, tmp_path: Path) -> None:
    """The heartbeat renews a running lease every ttl / 3: a run holding tenant q's only slot on
    one server for 3.5 times the lease TTL keeps it. Throughout, its lease is live by the
    database's clock, a request on another server waits in the fleet's queue (it polls, and would
    take an expired slot), and one more request is refused; the waiter gets the slot only when
    the run ends."""
    ttl_s, hold_s = 1.0, 3.5
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    registry = load_tenancy(tenants)
    tenant = registry.tenant("q")
    assert tenant is not None

    def live_leases() -> list[tuple[str, str, float]]:
        """(instance, state, seconds left by the database's clock), oldest first."""
        with psycopg.connect(pg_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT instance, state, expires_at - EXTRACT(EPOCH FROM clock_timestamp()) "
                "FROM quota_leases ORDER BY queued_seq"
            ).fetchall()
        return [(str(i), str(s), float(left)) for i, s, left in rows]

    async def scenario() -> tuple[list[tuple[float, list[tuple[str, str, float]]]], list[str]]:
        kwargs: dict[str, Any] = {"burst": lambda t: 100, "lease_ttl_s": ttl_s}
        first = GlobalQuotas(registry, pg_url, instance="renew-a", **kwargs)
        second = GlobalQuotas(registry, pg_url, instance="renew-b", **kwargs)
        await first.start()
        await second.start()
        samples: list[tuple[float, list[tuple[str, str, float]]]] = []
        events: list[str] = []
        try:
            held = first.admit(tenant)
            await held.__aenter__()
            admitted_at = time.monotonic()

            async def wait_for_slot() -> None:
                async with second.admit(tenant):
                    events.append("waiter admitted")

            waiter = asyncio.create_task(wait_for_slot())
            while [s for _, s, _ in await asyncio.to_thread(live_leases)] != [
                "running",
                "queued",
            ]:
                await asyncio.sleep(0.02)
            while (elapsed := time.monotonic() - admitted_at) < hold_s:
                samples.append((elapsed, await asyncio.to_thread(live_leases)))
                try:
                    async with second.admit(tenant):
                        events.append("admitted beside the run")
                except ResourceExhausted as exc:
                    events.append(str(exc))
                assert not waiter.done(), f"the waiter took the slot {elapsed:.1f} s into the run"
                await asyncio.sleep(0.1)
            events.append("run ends")
            await held.__aexit__(None, None, None)
            await asyncio.wait_for(waiter, 10)
        finally:
            await first.close()
            await second.close()
        return samples, events

    samples, events = asyncio.run(scenario())
    assert samples[-1][0] > hold_s - 0.5, samples[-1]  # the samples cover the whole hold
    for elapsed, rows in samples:
        assert [(i, s) for i, s, _ in rows] == [("renew-a", "running"), ("renew-b", "queued")]
        assert all(0 < left <= ttl_s for _, _, left in rows), (elapsed, rows)
    refused = (
        "tenant q: 1 executions running across the fleet (the maximum) and 1 waiting "
        "(the queue is full)"
    )
    assert events == [refused] * len(samples) + ["run ends", "waiter admitted"]
    assert leases(pg_url) == []
