"""One thread per process backend that removes the cgroups the event loop could not remove at
once: a dead sandbox's cgroup the kernel still finds busy (an rmdir that retries, sleeping).
The loop itself removes the usual one, empty at pid 1's exit (`ProcessBackend._reap`): an
rmdir per hierarchy there costs less than handing them to this thread, whose every syscall took
the GIL back from the loop (docs/backends.md has the figures).

Why one thread and not a worker-thread hop per sandbox: a hop to a worker and back for every
execution cost the host more CPU than the work itself (`bench.forkserver`), and right after an
execution it held up the reply to it. Here the event loop only puts the sandbox on a queue; the
thread wakes, waits `DELAY_S` for more to finish, and releases the whole batch, so that at
sustained load it wakes about once per `DELAY_S` rather than once per execution. Nothing comes
back to the loop; `drain` is how a caller waits until everything queued so far is released.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable

__all__ = ["DELAY_S", "Releaser"]

DELAY_S = 0.02
log = logging.getLogger(__name__)

_Item = Callable[[], None] | threading.Event | None


class Releaser:
    """Runs queued release callables in one thread of its own, in batches, in order."""

    def __init__(self, name: str = "ptc-release") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def release(self, work: Callable[[], None]) -> None:
        """Queues ``work`` (blocking, milliseconds) to run soon in the releasing thread."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._queue.put(work)

    async def drain(self) -> None:
        """Waits until everything queued before this call has been released."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(done)
        await asyncio.to_thread(done.wait)

    def close(self) -> None:
        """Releases what is queued and stops the thread (blocking); `release` starts it anew."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            time.sleep(DELAY_S)  # let the sandboxes finishing meanwhile join this batch
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = False
            for item in batch:
                if item is None:
                    stop = True
                elif isinstance(item, threading.Event):
                    item.set()
                else:
                    try:
                        item()
                    except OSError as exc:
                        # Nobody awaits this for a result: say so here, or the leak goes unseen.
                        log.warning("a finished sandbox's cgroup could not be removed: %s", exc)
            if stop:
                return
