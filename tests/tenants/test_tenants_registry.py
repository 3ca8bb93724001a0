"""`TenantRegistry`: authentication, per-tenant concurrency with a bounded queue, and rate.

Quotas are exercised at the `Tenancy.admit` level with real asyncio tasks that hold their slot
for a short sleep; nothing asserts on durations. The rate tests drive the token bucket with an
injected clock, so they do not depend on how fast the machine is.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sandbox.errors import ResourceExhausted, Unauthenticated
from sandbox.tenants import TenantRegistry, hash_key, load_tenancy, parse_tenants
from sandbox.tenants.base import Tenant


def _registry(text: str, clock: list[float] | None = None) -> TenantRegistry:
    now = clock if clock is not None else [0.0]
    return TenantRegistry(parse_tenants(text), clock=lambda: now[0])


def _tenant_toml(tid: str, key: str, **fields: object) -> str:
    lines = [f'[[tenant]]\nid = "{tid}"\nkeys = ["{hash_key(key)}"]']
    lines += [f"{name} = {value}" for name, value in fields.items()]
    return "\n".join(lines) + "\n"


def test_authentication_from_bearer_metadata(tmp_path: Path) -> None:
    config = tmp_path / "tenants.toml"
    config.write_text(
        _tenant_toml("acme", "key-a")
        + f'[[tenant]]\nid = "globex"\nkeys = ["{hash_key("key-b", "scrypt")}", "{hash_key("key-c")}"]\n'
    )
    registry = load_tenancy(config)
    assert registry.requires_auth
    assert registry.authenticate({"authorization": "Bearer key-a"}).id == "acme"
    assert registry.authenticate({"Authorization": "bearer  key-b "}).id == "globex"
    assert registry.authenticate({"authorization": "Bearer key-b"}).id == "globex"  # cached
    assert registry.authenticate({"authorization": "Bearer key-c"}).id == "globex"
    for metadata, message in [
        ({}, "missing"),
        ({"authorization": "key-a"}, "Bearer"),
        ({"authorization": "Basic key-a"}, "Bearer"),
        ({"authorization": "Bearer "}, "Bearer"),
        ({"authorization": "Bearer key-z"}, "unknown API key"),
        ({"authorization": "Bearer " + hash_key("key-a")}, "unknown API key"),
    ]:
        with pytest.raises(Unauthenticated, match=message):
            registry.authenticate(metadata)


async def _flood(
    registry: TenantRegistry, tenant: Tenant, count: int, log: list[str], hold_s: float
) -> tuple[int, list[ResourceExhausted], int]:
    running = 0
    peak = 0
    refused: list[ResourceExhausted] = []

    async def one() -> None:
        nonlocal running, peak
        try:
            async with registry.admit(tenant):
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(hold_s)
                running -= 1
                log.append(tenant.id)
        except ResourceExhausted as exc:
            refused.append(exc)

    await asyncio.gather(*(one() for _ in range(count)))
    return peak, refused, running


def test_fifty_concurrent_requests_from_two_tenants() -> None:
    registry = _registry(
        _tenant_toml("acme", "a", max_concurrent=3, queue=10)
        + _tenant_toml("globex", "b", max_concurrent=2, queue=10)
    )
    acme, globex = registry.tenant("acme"), registry.tenant("globex")
    assert acme is not None and globex is not None
    log: list[str] = []

    async def main() -> tuple[
        tuple[int, list[ResourceExhausted], int], tuple[int, list[ResourceExhausted], int]
    ]:
        return await asyncio.gather(
            _flood(registry, acme, 25, log, 0.01), _flood(registry, globex, 25, log, 0.01)
        )

    (a_peak, a_refused, a_left), (g_peak, g_refused, g_left) = asyncio.run(main())
    # Each held to its own concurrency ...
    assert (a_peak, g_peak) == (3, 2)
    # ... with its own bounded queue: beyond running + queued, refused with a retry-after.
    assert len(a_refused) == 25 - 3 - 10 and len(g_refused) == 25 - 2 - 10
    assert all(e.retry_after_s and e.retry_after_s > 0 for e in a_refused + g_refused)
    assert all("queue is full" in e.message for e in a_refused + g_refused)
    assert log.count("acme") == 13 and log.count("globex") == 12
    # Neither starved: completions of both tenants interleave from the start.
    assert "globex" in log[:5] and "acme" in log[:5]
    assert (a_left, g_left) == (0, 0)
    assert registry.stats("acme") == (0, 0) and registry.stats("globex") == (0, 0)


def test_one_tenants_flood_does_not_delay_another() -> None:
    registry = _registry(
        _tenant_toml("acme", "a", max_concurrent=2, queue=5) + _tenant_toml("globex", "b")
    )
    acme, globex = registry.tenant("acme"), registry.tenant("globex")
    assert acme is not None and globex is not None

    async def main() -> None:
        release = asyncio.Event()
        started = 0

        async def hog() -> None:
            nonlocal started
            async with registry.admit(acme):
                started += 1
                await release.wait()

        hogs = [asyncio.create_task(hog()) for _ in range(7)]
        await asyncio.sleep(0)
        assert registry.stats("acme") == (2, 5)
        with pytest.raises(ResourceExhausted):
            async with registry.admit(acme):
                pass
        # globex is admitted at once, while acme's slots and queue are full.
        async with registry.admit(globex):
            assert registry.stats("globex") == (1, 0)
        release.set()
        await asyncio.gather(*hogs)
        assert started == 7

    asyncio.run(main())


def test_fifo_order_and_cancelled_waiters() -> None:
    registry = _registry(_tenant_toml("acme", "a", max_concurrent=1, queue=5))
    acme = registry.tenant("acme")
    assert acme is not None

    async def main() -> list[int]:
        order: list[int] = []
        gate = asyncio.Event()

        async def job(i: int) -> None:
            async with registry.admit(acme):
                order.append(i)
                if i == 0:
                    await gate.wait()

        tasks = [asyncio.create_task(job(i)) for i in range(5)]
        await asyncio.sleep(0)
        assert registry.stats("acme") == (1, 4)
        tasks[2].cancel()  # a waiter that gives up leaves the queue
        await asyncio.sleep(0)
        assert registry.stats("acme") == (1, 3)
        gate.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert registry.stats("acme") == (0, 0)
        return order

    assert asyncio.run(main()) == [0, 1, 3, 4]


def test_rate_limit_answers_with_retry_after() -> None:
    now = [1000.0]
    registry = _registry(
        _tenant_toml("acme", "a", rate_per_minute=6, rate_burst=2) + _tenant_toml("globex", "b"),
        clock=now,
    )
    acme, globex = registry.tenant("acme"), registry.tenant("globex")
    assert acme is not None and globex is not None

    async def admit(tenant: Tenant) -> None:
        async with registry.admit(tenant):
            pass

    async def main() -> None:
        await admit(acme)
        await admit(acme)
        with pytest.raises(
            ResourceExhausted, match="rate limit of 6 executions per minute"
        ) as caught:
            await admit(acme)
        assert caught.value.retry_after_s == pytest.approx(10.0)
        await admit(globex)  # another tenant's bucket is its own
        now[0] += 4.0
        with pytest.raises(ResourceExhausted) as caught:
            await admit(acme)
        assert caught.value.retry_after_s == pytest.approx(6.0)
        now[0] += 6.0
        await admit(acme)
        now[0] += 3600.0  # a long pause refills only up to the burst
        await admit(acme)
        await admit(acme)
        with pytest.raises(ResourceExhausted):
            await admit(acme)

    asyncio.run(main())


def test_a_refused_request_does_not_spend_a_token() -> None:
    registry = _registry(
        _tenant_toml("acme", "a", max_concurrent=1, queue=0, rate_per_minute=60, rate_burst=2)
    )
    acme = registry.tenant("acme")
    assert acme is not None

    async def main() -> None:
        async with registry.admit(acme):
            for _ in range(3):
                with pytest.raises(ResourceExhausted, match="queue is full"):
                    async with registry.admit(acme):
                        pass
        async with registry.admit(acme):  # the second token is still there
            pass

    asyncio.run(main())
