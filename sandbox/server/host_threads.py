"""The threads that run host handlers written as plain functions: daemon threads of their own.

Why not `asyncio.to_thread` (the loop's default `ThreadPoolExecutor`): a handler that blocks past
its timeout keeps its thread, since a thread cannot be stopped, and in the default executor that
thread was one fewer for the server's own blocking work (store recovery, readiness pings), and
was joined when the loop closed and again at interpreter exit. A handler stuck in a call with no
timeout of its own (``time.sleep(3600)``, a socket read) so held `ptc serve`'s exit after SIGTERM
for as long as it blocked. `concurrent.futures` has no daemon workers, hence this module.

At most ``size`` threads run handlers (the server's ``host_handler_concurrency``); a call beyond
them waits for one, inside its timeout, so handlers that hang use up these threads and no
others. `close` ends the idle threads at the server's stop; threads still running a handler then
are left behind (`busy` names them for the shutdown log), and the process exits without them. A
call whose caller gave up before a thread took it is not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HostThreads"]


@dataclass
class _Job:
    tool: str
    function: Callable[..., Any]
    kwargs: dict[str, Any]
    context: contextvars.Context  # the caller's (tracing spans), as `asyncio.to_thread` passes it
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    started: threading.Event  # a thread took it


class HostThreads:
    """Runs blocking host handlers on at most ``size`` daemon threads, started as needed."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"host handler threads: size must be at least 1, got {size}")
        self.size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: a thread ends
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job that no queued job has claimed yet
        self._running: dict[int, tuple[str, float]] = {}  # thread id: (tool, monotonic start)
        self._closed = False

    async def run(
        self,
        tool: str,
        function: Callable[..., Any],
        kwargs: dict[str, Any],
        started: threading.Event | None = None,
    ) -> Any:
        """``function(**kwargs)`` on one of the threads; its result or exception. ``started``
        is set when a thread takes the call (a caller that gave up can tell whether it ran)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        context = contextvars.copy_context()
        job = _Job(tool, function, kwargs, context, future, loop, started or threading.Event())
        name = ""  # of a thread to start for it
        with self._lock:
            if self._closed:
                raise RuntimeError("the host handler threads are closed: the server has stopped")
            if self._idle:
                self._idle -= 1
            elif self._threads < self.size:
                self._threads += 1
                name = f"ptc-host-handler-{self._threads}"
            # else every thread is busy: the job waits for the first one free
        self._jobs.put(job)
        if name:
            threading.Thread(target=self._work, name=name, daemon=True).start()
        return await future

    def close(self) -> None:
        """Idle threads end now, busy ones once their handler returns; no call is taken after
        it."""
        with self._lock:
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)

    def busy(self) -> list[tuple[str, float]]:
        """The tools whose handlers run now, with how long each has run (s), longest first."""
        now = time.monotonic()
        with self._lock:
            running = [(tool, now - started) for tool, started in self._running.values()]
        return sorted(running, key=lambda item: -item[1])

    def _work(self) -> None:
        ident = threading.get_ident()
        while True:
            job = self._jobs.get()
            if job is None:
                with self._lock:
                    self._threads -= 1
                return
            if job.future.cancelled():  # its caller gave up while it waited: not run
                with self._lock:
                    self._idle += 1
                continue
            with self._lock:
                self._running[ident] = (job.tool, time.monotonic())
            job.started.set()
            value: Any = None
            error: BaseException | None = None
            try:
                value = job.context.run(job.function, **job.kwargs)
            except BaseException as exc:  # the handler's, delivered to its caller
                error = exc
            with self._lock:  # free before its caller hears of it
                del self._running[ident]
                self._idle += 1
            self._deliver(job, value, error)

    @staticmethod
    def _deliver(job: _Job, value: Any, exc: BaseException | None) -> None:
        def settle() -> None:
            if job.future.done():  # timed out or cancelled meanwhile
                return
            if exc is not None:
                job.future.set_exception(exc)
            else:
                job.future.set_result(value)

        # A closed loop (RuntimeError): the server has stopped, nobody waits for it.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(settle)
