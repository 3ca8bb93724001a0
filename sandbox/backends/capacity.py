"""How many sandboxes a backend keeps alive at once (`max_sandboxes`), idle and running alike,
and who gets the room when it is all taken.

A warm sandbox holds its room while it waits: its memory is as real as a running one's, and
`max_sandboxes` is what the server's memory budget allows (`sandbox.server.memory_budget`). So
idle sandboxes could hold every room while an execution waits for one that no pool will ever
give back: a pool that keeps two warm under `max_sandboxes = 2`, an execution that needs another
runtime or another private tmp size than the warm ones, or a burst that made a pool raise its
target. Three rules keep that from ever waiting forever:

- A start for demand (an execution waits for it) waits its turn for a room, first come first
  served; a start that only fills a pool (speculative) takes a room only when one is free and no
  demand waits, and otherwise does not start at all (`AtCapacity`: the pool tries again when a
  room is given back).
- While demand waits, idle pooled sandboxes give their rooms up: one per waiter is disposed of
  when the waiter arrives, and a pooled sandbox that finishes starting then is disposed of
  instead of kept (`wants_room`).
- Closing fails every waiter (`Unavailable`), so that no start outlives its backend.

`asyncio.Semaphore` has no notion of the speculative start that must not queue or of rooms held
by something that can be asked to give them up, hence this small class.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Protocol

from sandbox.errors import Unavailable

__all__ = ["AtCapacity", "Capacity", "Evictable"]


class AtCapacity(Exception):
    """A speculative start found no free room: not a failure, the pool waits for one."""


class Evictable(Protocol):
    """A warm pool as `Capacity` sees it."""

    @property
    def closed(self) -> bool: ...

    def evict_idle(self) -> bool:
        """Disposes of one idle sandbox (its room comes back when it is gone); False: none."""

    def room_freed(self) -> None:
        """A room is free: a pool that could not fill itself for want of one tries again."""


class Capacity:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_sandboxes must be at least 1, not {limit}")
        self.limit = limit
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._evicting = 0  # idle sandboxes asked to give their room up, not yet gone
        self._pools: list[Evictable] = []
        self._closed = False
        self.evicted = 0  # idle sandboxes disposed of for demand, ever

    @property
    def held(self) -> int:
        """Rooms taken: sandboxes starting, idle or running."""
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        """Starts for demand waiting for a room."""
        return len(self._waiters)

    def add_pool(self, pool: Evictable) -> None:
        self._pools = [p for p in self._pools if not p.closed]
        self._pools.append(pool)

    def try_take(self) -> bool:
        """A room for a speculative start, if one is free and no demand waits."""
        if self._closed or not self._free or self._waiters:
            return False
        self._free -= 1
        return True

    def take_speculative(self) -> None:
        """`try_take`, raising `AtCapacity` when there is no room."""
        if not self.try_take():
            raise AtCapacity(f"all {self.limit} sandboxes (max_sandboxes) are in use")

    async def take(self) -> None:
        """A room for a start that an execution waits for; waits its turn when none is free
        (idle pooled sandboxes are asked to give theirs up meanwhile). Cancel-safe."""
        if self._closed:
            raise Unavailable("the backend is closing")
        if self._free and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._evict_for_waiters()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give_back()  # the room was handed over just as we left
            else:
                self._discard(waiter)
            raise

    def give_back(self) -> None:
        """A sandbox is gone (or a start failed): its room goes to the first waiter, else it
        is free again and the pools that went without may fill."""
        if self._evicting:
            # Possibly not the evicted one's room; counting it early can only evict more.
            self._evicting -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
        if not self._closed:
            for pool in self._pools:
                if not pool.closed:
                    pool.room_freed()

    def wants_room(self) -> bool:
        """Whether a pooled sandbox that just finished starting should give its room up to a
        waiting start instead of waiting idle (and be disposed of by its pool)."""
        if len(self._waiters) > self._evicting:
            self._evicting += 1
            self.evicted += 1
            return True
        return False

    def close(self) -> None:
        """Fails every waiting start; later takes fail too."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Unavailable("the backend is closing"))

    def _evict_for_waiters(self) -> None:
        for pool in self._pools:
            while len(self._waiters) > self._evicting and not pool.closed and pool.evict_idle():
                self._evicting += 1
                self.evicted += 1

    def _discard(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):  # already handed a room or failed
            self._waiters.remove(waiter)
