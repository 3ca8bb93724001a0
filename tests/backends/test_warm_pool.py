"""The warm pool's refill rules (`sandbox.backends.pool`), with plain objects as sandboxes: the
pool only starts, hands out and disposes of what its factory makes."""

from __future__ import annotations

import asyncio
import itertools

from sandbox.backends.pool import REFILL_DELAY_S, WarmPool


class Starts:
    """A factory whose starts can be held, counting how many run at once."""

    def __init__(self) -> None:
        self.names = itertools.count(1)
        self.running = 0
        self.most = 0
        self.release = asyncio.Event()
        self.release.set()
        self.disposed: list[int] = []

    async def start(self, demand: bool) -> int:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
            return next(self.names)
        finally:
            self.running -= 1

    async def dispose(self, handle: int) -> None:
        self.disposed.append(handle)


def _pool(starts: Starts, size: int, max_idle: int, max_starting: int = 2) -> WarmPool[int]:
    return WarmPool(
        factory=starts.start,
        dispose=starts.dispose,
        alive=lambda _h: True,
        size=size,
        max_idle=max_idle,
        max_starting=max_starting,
    )


def test_a_quiet_pool_replaces_a_taken_sandbox_a_moment_later() -> None:
    asyncio.run(_a_quiet_pool_replaces_a_taken_sandbox_a_moment_later())


async def _a_quiet_pool_replaces_a_taken_sandbox_a_moment_later() -> None:
    starts = Starts()
    pool = _pool(starts, size=2, max_idle=4)
    pool.start()
    await pool.wait_ready(5)
    await pool.acquire()
    assert (pool.idle, pool.target, pool._starting) == (1, 2, 0)  # held back: nothing starts
    await asyncio.sleep(REFILL_DELAY_S * 4)
    assert (pool.idle, pool.target) == (2, 2)
    await pool.close()
    assert sorted(starts.disposed) == [2, 3]


def test_a_pool_that_demand_outran_replaces_a_taken_sandbox_at_once() -> None:
    asyncio.run(_a_pool_that_demand_outran_replaces_a_taken_sandbox_at_once())


async def _a_pool_that_demand_outran_replaces_a_taken_sandbox_at_once() -> None:
    starts = Starts()
    pool = _pool(starts, size=1, max_idle=4)
    pool.start()
    await pool.wait_ready(5)
    for _ in range(4):
        await pool.acquire()  # the last three found none idle: misses raise the target
    assert pool.misses == 3 and pool.target == 4
    await pool.wait_ready(5)
    await pool.acquire()
    await pool.acquire()
    assert pool.idle == 2 and pool._starting == 0  # half the target still idle: held back
    await pool.acquire()
    # Fewer than half idle: demand outruns the pool, and the replacements start now.
    assert pool.idle == 1 and pool._starting == 3
    await pool.close()


def test_starts_run_at_most_max_starting_at_once() -> None:
    asyncio.run(_starts_run_at_most_max_starting_at_once())


async def _starts_run_at_most_max_starting_at_once() -> None:
    starts = Starts()
    starts.release.clear()
    pool = _pool(starts, size=2, max_idle=8, max_starting=3)
    pool.start()
    takers = [asyncio.ensure_future(pool.acquire()) for _ in range(6)]
    await asyncio.sleep(0.05)
    assert starts.running == 3  # the others wait for a start slot
    starts.release.set()
    handles = await asyncio.gather(*takers)
    assert len(set(handles)) == 6 and starts.most == 3
    await pool.close()
