"""A warm pool of single-use sandboxes, so that starting one is off the request path.

The pool keeps `target` sandboxes started and ready, between `size` and `max_idle`: an acquire
that finds none idle raises the target by one (demand outran the pool), and an acquire that
comes `SHRINK_AFTER_S` or more after the last miss lowers it by one (and disposes of one surplus
idle sandbox), so a burst is met by more warm sandboxes and a calmer pool goes back to `size`.
Taking one triggers a refill in the background (deferred by `REFILL_DELAY_S` while others are
still idle). A sandbox leaves the pool exactly once and is never returned to it. Starts run at
most `max_starting` at a time so that a burst of demand does not starve running scripts of CPU;
a failed start is retried after a growing back-off.

Under a backend's `max_sandboxes` (`sandbox.backends.capacity`) the pool's own refills are
speculative: they start only where a room is free and no execution waits for one, and a start
that found none (`AtCapacity`) is tried again when a room is given back. An acquire that finds
no idle sandbox starts one for demand, which waits its turn for a room; while it waits, idle
sandboxes (of this pool or another) give their rooms up (`evict_idle`, ``room_wanted``).

How long each start took goes to the observers given to `observe_starts` (the metrics, once
they are on): the pool reports up without importing what reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from sandbox.backends.capacity import AtCapacity

__all__ = ["StartObserver", "WarmPool", "observe_starts"]

H = TypeVar("H")
REFILL_DELAY_S = 0.05
SHRINK_AFTER_S = 10.0
log = logging.getLogger(__name__)

StartObserver = Callable[[object, float], None]
"""``observer(pool, seconds)``: a warm pool started one sandbox, in that many seconds."""

_start_observers: list[StartObserver] = []


def observe_starts(observer: StartObserver) -> None:
    """Calls ``observer`` after every sandbox any warm pool of this process starts (once per
    observer, however often it is given)."""
    if observer not in _start_observers:
        _start_observers.append(observer)


class WarmPool(Generic[H]):
    def __init__(
        self,
        factory: Callable[[bool], Awaitable[H]],
        dispose: Callable[[H], Awaitable[None]],
        alive: Callable[[H], bool],
        size: int,
        max_starting: int = 2,
        max_idle: int | None = None,
        room_wanted: Callable[[], bool] | None = None,
    ) -> None:
        """``factory(demand)`` starts one sandbox: ``demand`` is True for an acquire that
        waits for it and False for a refill, which raises `AtCapacity` rather than wait for a
        room. ``room_wanted()`` (`Capacity.wants_room`) says whether a sandbox that just
        finished starting should be disposed of, its room going to a start that waits."""
        self._factory = factory
        self._room_wanted = room_wanted
        self._dispose = dispose
        self._alive = alive
        self.size = size
        self.max_idle = max(size, max_idle if max_idle is not None else size)
        self.target = size
        self._last_miss = 0.0
        self.misses = 0  # acquires that found no idle sandbox
        self._idle: deque[H] = deque()
        self._starting = 0
        self._start_slots = asyncio.Semaphore(max_starting)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.started_total = 0
        self.failed_starts = 0
        self.last_error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._starved = False  # a refill found no room: `room_freed` tries again

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def settled(self) -> bool:
        """Full, and nothing under way: no start, no disposal, no deferred refill (which would
        start a sandbox a moment later). For leftover checks in tests and benchmarks."""
        busy = self._starting or self._tasks or self._timer is not None
        return not busy and len(self._idle) >= self.target

    def _refill(self) -> None:
        while not self._closed and len(self._idle) + self._starting < self.target:
            self._starting += 1
            task = asyncio.create_task(self._start_one())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refill_soon(self) -> None:
        """Refills at once when fewer than half the target are idle (demand is outrunning the
        pool); otherwise a moment later, so that starting a replacement does not compete with
        the execution that just took one, on machines with few cores (a start beside a
        warm ``print(1)`` made it 4.5 -> 11.9 ms, 2 cores). Holding every refill back was the
        bound on sustained throughput: at 4 executions at a time on 2 cores, 30% of acquires
        found the pool empty and waited about 55 ms (`bench.forkserver`)."""
        if len(self._idle) * 2 < self.target:
            self._refill()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(REFILL_DELAY_S, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._refill()

    async def _start_one(self) -> None:
        failed = False
        try:
            handle = await self._create(demand=False)
        except AtCapacity:
            self._starved = True
            return
        except Exception as exc:
            failed = True
            self.failed_starts += 1
            self.last_error = exc
            log.warning("warm pool: a sandbox failed to start: %s", exc)
            await asyncio.sleep(min(5.0, 0.1 * self.failed_starts))
            return
        finally:
            self._starting -= 1
            if failed and not self._closed:
                self._refill()  # try again after the back-off, not only at the next acquire
        self.failed_starts = 0
        if self._closed:
            await self._dispose(handle)
            return
        if self._room_wanted is not None and self._room_wanted():
            self._starved = True  # its room went to a waiting start: warm again once free
            await self._dispose(handle)
            return
        self._idle.append(handle)

    async def _create(self, demand: bool) -> H:
        async with self._start_slots:
            started = time.monotonic()
            handle = await self._factory(demand)
            for observer in _start_observers:
                observer(self, time.monotonic() - started)
            self.started_total += 1
            return handle

    def start(self) -> None:
        self._refill()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the pool is full (for benchmarks and tests)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._idle) < self.target and loop.time() < deadline:
            self._refill()
            await asyncio.sleep(0.01)

    def _adapt(self, missed: bool) -> None:
        now = asyncio.get_running_loop().time()
        if missed:
            self.misses += 1
            self._last_miss = now
            self.target = min(self.max_idle, self.target + 1)
        elif self.target > self.size and now - self._last_miss > SHRINK_AFTER_S:
            self._last_miss = now  # one step per quiet period
            self.target -= 1
            if len(self._idle) > self.target:
                surplus = self._idle.popleft()  # the oldest: its zygote may be retired
                task = asyncio.create_task(self._discard(surplus))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _discard(self, handle: H) -> None:
        await self._dispose(handle)

    def evict_idle(self) -> bool:
        """Disposes of the oldest idle sandbox so that its room goes to a start that waits for
        one (`sandbox.backends.capacity`); False when none is idle."""
        if not self._idle or self._closed:
            return False
        self._starved = True  # warm again once a room is free (`room_freed`)
        task = asyncio.create_task(self._discard(self._idle.popleft()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def room_freed(self) -> None:
        """A room came free: a pool that went without one fills now."""
        if self._starved and not self._closed:
            self._starved = False
            self._refill()

    async def acquire(self) -> H:
        """A ready sandbox; started on demand when none is idle."""
        self._adapt(missed=not self._idle)
        while self._idle:
            handle = self._idle.popleft()
            if self._alive(handle):
                self._refill_soon()
                return handle
            await self._dispose(handle)
        self._refill()
        return await self._create(demand=True)

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._idle:
            await self._dispose(self._idle.popleft())
