"""`max_sandboxes` shared by warm pools and starts on demand (`sandbox.backends.capacity`),
with plain objects as sandboxes: who waits, who gives a room up, and that nothing waits forever.
The real process backend under the same rules: `tests/backends/test_max_sandboxes.py`."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from sandbox.backends.capacity import AtCapacity, Capacity
from sandbox.backends.pool import WarmPool
from sandbox.errors import Unavailable


class Backend:
    """Starts plain sandboxes under one `Capacity`, as the process backend's ``_spawn`` does:
    a room taken before the start, given back when the sandbox is disposed of."""

    def __init__(self, limit: int) -> None:
        self.capacity = Capacity(limit)
        self.names = itertools.count(1)
        self.alive: set[int] = set()
        self.gate = asyncio.Event()  # starts finish only while set
        self.gate.set()

    async def start(self, demand: bool) -> int:
        if demand:
            await self.capacity.take()
        else:
            self.capacity.take_speculative()
        try:
            await self.gate.wait()
        except BaseException:
            self.capacity.give_back()
            raise
        name = next(self.names)
        self.alive.add(name)
        return name

    async def dispose(self, name: int) -> None:
        await asyncio.sleep(0)
        self.alive.remove(name)
        self.capacity.give_back()

    def pool(self, size: int, max_idle: int | None = None) -> WarmPool[int]:
        pool: WarmPool[int] = WarmPool(
            factory=self.start,
            dispose=self.dispose,
            alive=lambda name: name in self.alive,
            size=size,
            max_idle=max_idle,
            max_starting=4,  # as the process backend's (two per CPU): starts wait for rooms
            room_wanted=self.capacity.wants_room,
        )
        self.capacity.add_pool(pool)
        return pool


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_speculative_start_never_queues_and_demand_waits_its_turn() -> None:
    asyncio.run(_a_speculative_start_never_queues_and_demand_waits_its_turn())


async def _a_speculative_start_never_queues_and_demand_waits_its_turn() -> None:
    capacity = Capacity(1)
    await capacity.take()
    with pytest.raises(AtCapacity, match="all 1 sandboxes"):
        capacity.take_speculative()
    first = asyncio.ensure_future(capacity.take())
    second = asyncio.ensure_future(capacity.take())
    await _settle()
    assert capacity.waiting == 2
    capacity.give_back()
    await _settle()
    assert first.done() and not second.done()  # first come, first served
    assert not capacity.try_take()  # a waiter still there: a refill does not jump the queue
    capacity.give_back()
    await second
    capacity.give_back()
    assert (capacity.held, capacity.waiting) == (0, 0)


def test_a_cancelled_waiter_leaves_the_queue_and_keeps_no_room() -> None:
    asyncio.run(_a_cancelled_waiter_leaves_the_queue_and_keeps_no_room())


async def _a_cancelled_waiter_leaves_the_queue_and_keeps_no_room() -> None:
    capacity = Capacity(1)
    await capacity.take()
    waiter = asyncio.ensure_future(capacity.take())
    await _settle()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert capacity.waiting == 0
    capacity.give_back()
    assert capacity.held == 0
    # Handed the room in the same step as its cancel: the room comes back, not lost.
    await capacity.take()
    late = asyncio.ensure_future(capacity.take())
    await _settle()
    capacity.give_back()  # hands the room to ``late``...
    late.cancel()  # ...which is cancelled before it runs
    await asyncio.gather(late, return_exceptions=True)
    assert (capacity.held, capacity.waiting) == (0, 0)


def test_closing_fails_the_waiters_and_later_takes() -> None:
    asyncio.run(_closing_fails_the_waiters_and_later_takes())


async def _closing_fails_the_waiters_and_later_takes() -> None:
    capacity = Capacity(1)
    await capacity.take()
    waiter = asyncio.ensure_future(capacity.take())
    await _settle()
    capacity.close()
    with pytest.raises(Unavailable, match="the backend is closing"):
        await waiter
    with pytest.raises(Unavailable, match="the backend is closing"):
        await capacity.take()
    assert not capacity.try_take()


def test_max_sandboxes_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_sandboxes must be at least 1, not 0"):
        Capacity(0)


def test_demand_takes_the_room_of_another_pools_idle_sandbox() -> None:
    asyncio.run(_demand_takes_the_room_of_another_pools_idle_sandbox())


async def _demand_takes_the_room_of_another_pools_idle_sandbox() -> None:
    # Two rooms, both held by idle sandboxes of pool A (say, another runtime's); pool B has
    # none idle. Before, B's acquire waited for a room that nobody would ever give back.
    backend = Backend(2)
    a, b = backend.pool(size=2), backend.pool(size=1)
    a.start()
    await a.wait_ready(5)
    b.start()  # its refill finds no room: not a failure, no retry loop
    await _settle()
    assert (a.idle, b.idle, b.failed_starts, backend.capacity.held) == (2, 0, 0, 2)
    name = await asyncio.wait_for(b.acquire(), 5)
    assert name in backend.alive
    assert (a.idle, backend.capacity.evicted, backend.capacity.held) == (1, 1, 2)
    # Once that execution's sandbox is gone, the pool that gave its room up is warm again.
    await backend.dispose(name)
    await _settle()
    assert (a.idle, backend.capacity.held) == (2, 2)
    await b.close()
    await a.close()
    assert (backend.alive, backend.capacity.held) == (set(), 0)


def test_an_acquire_while_every_room_is_starting_gets_a_sandbox() -> None:
    asyncio.run(_an_acquire_while_every_room_is_starting_gets_a_sandbox())


async def _an_acquire_while_every_room_is_starting_gets_a_sandbox() -> None:
    # The CI hang of stop 30: `max_sandboxes` 2 (a memory budget), a pool of 2 still starting
    # when the first execution came. Its miss raised the target to 3 and its own start waited
    # for a room; the two pooled starts then went idle and kept both rooms for ever.
    backend = Backend(2)
    pool = backend.pool(size=2, max_idle=2)
    backend.gate.clear()
    pool.start()
    await _settle()
    taker = asyncio.ensure_future(pool.acquire())
    await _settle()
    assert (backend.capacity.held, backend.capacity.waiting) == (2, 1)
    backend.gate.set()
    name = await asyncio.wait_for(taker, 5)
    # One pooled sandbox gave its room up the moment it was ready; the other stays warm.
    assert backend.capacity.evicted == 1
    assert pool.target == 2  # never above max_sandboxes
    await backend.dispose(name)
    await _settle()  # the room it gave up came back: the pool fills itself again
    assert (pool.idle, backend.capacity.held) == (2, 2)
    await pool.close()
    assert (backend.alive, backend.capacity.held) == (set(), 0)


def test_a_pool_that_went_without_fills_when_a_room_is_given_back() -> None:
    asyncio.run(_a_pool_that_went_without_fills_when_a_room_is_given_back())


async def _a_pool_that_went_without_fills_when_a_room_is_given_back() -> None:
    backend = Backend(2)
    pool = backend.pool(size=2)
    running = [await backend.start(demand=True), await backend.start(demand=True)]
    pool.start()
    await _settle()
    assert (pool.idle, pool.failed_starts) == (0, 0)
    await backend.dispose(running.pop())
    await _settle()
    assert pool.idle == 1
    await backend.dispose(running.pop())
    await _settle()
    assert (pool.idle, backend.capacity.held) == (2, 2)
    await pool.close()
    assert backend.capacity.held == 0
