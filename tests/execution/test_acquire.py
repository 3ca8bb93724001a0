"""`acquire_unless_cancelled` (`sandbox.execution.acquire`): a warm sandbox comes back in the
caller's own task with nothing raced; an acquire that has to wait is raced against ``cancel``,
stopped where it waits when ``cancel`` wins, and a sandbox that still arrives is disposed of.
The backend here is a plain object whose acquire waits where the test says (the real process
backend under `max_sandboxes`: tests/backends/test_max_sandboxes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox.errors import Unavailable
from sandbox.execution.acquire import acquire_unless_cancelled
from sandbox.limits import DEFAULTS


class Handle:
    def __init__(self) -> None:
        self.disposed = False

    async def dispose(self) -> None:
        self.disposed = True


class Backend:
    """``acquire`` returns at once, or first waits for ``gate`` (``wait=True``)."""

    def __init__(self, *, wait: bool = False, fail: BaseException | None = None) -> None:
        self.wait = wait
        self.fail = fail
        self.gate = asyncio.Event()
        self.tasks: list[asyncio.Task[Any] | None] = []  # the task each step ran in
        self.saw: BaseException | None = None  # what was thrown in where it waited
        self.keep_going = False  # a start that cannot be interrupted: returns anyway
        self.handles: list[Handle] = []

    async def acquire(self, limits: object, runtime: str | None = None) -> Handle:
        self.tasks.append(asyncio.current_task())
        if self.wait:
            try:
                await self.gate.wait()
            except BaseException as exc:
                self.saw = exc
                if not self.keep_going:
                    raise
                await asyncio.sleep(0.001)  # and waits once more before it delivers
            self.tasks.append(asyncio.current_task())
        if self.fail is not None:
            raise self.fail
        handle = Handle()
        self.handles.append(handle)
        return handle


async def _acquire(backend: Backend, cancel: asyncio.Event | None) -> Any:
    return await acquire_unless_cancelled(backend, DEFAULTS, None, cancel)  # type: ignore[arg-type]


def test_a_warm_sandbox_comes_back_in_the_callers_task() -> None:
    async def scenario() -> None:
        backend = Backend()
        handle = await _acquire(backend, asyncio.Event())
        assert handle is backend.handles[0]
        assert backend.tasks == [asyncio.current_task()]  # stepped inline: no task, no race

    asyncio.run(scenario())


def test_an_acquire_that_waits_is_finished_in_a_task_of_its_own() -> None:
    async def scenario() -> None:
        backend = Backend(wait=True)
        taking = asyncio.ensure_future(_acquire(backend, asyncio.Event()))
        await asyncio.sleep(0.01)
        backend.gate.set()
        handle = await taking
        assert handle is backend.handles[0] and not handle.disposed
        first, second = backend.tasks
        assert first is taking and second is not taking and second is not None

    asyncio.run(scenario())


def test_an_error_after_the_wait_reaches_the_caller() -> None:
    async def scenario() -> None:
        backend = Backend(wait=True, fail=Unavailable("the sandbox did not start"))
        taking = asyncio.ensure_future(_acquire(backend, asyncio.Event()))
        await asyncio.sleep(0.01)
        backend.gate.set()
        with pytest.raises(Unavailable, match="the sandbox did not start"):
            await taking

    asyncio.run(scenario())


def test_an_error_before_any_wait_reaches_the_caller() -> None:
    async def scenario() -> None:
        backend = Backend(fail=Unavailable("the process backend is not started"))
        with pytest.raises(Unavailable, match="the process backend is not started"):
            await _acquire(backend, asyncio.Event())

    asyncio.run(scenario())


def test_cancel_stops_the_acquire_where_it_waits() -> None:
    async def scenario() -> None:
        backend = Backend(wait=True)
        cancel = asyncio.Event()
        taking = asyncio.ensure_future(_acquire(backend, cancel))
        await asyncio.sleep(0.01)
        cancel.set()
        assert await taking is None
        await asyncio.sleep(0)
        assert isinstance(backend.saw, asyncio.CancelledError)
        assert backend.handles == []

    asyncio.run(scenario())


def test_a_sandbox_that_arrives_after_cancel_is_disposed_of() -> None:
    async def scenario() -> None:
        backend = Backend(wait=True)
        backend.keep_going = True
        cancel = asyncio.Event()
        taking = asyncio.ensure_future(_acquire(backend, cancel))
        await asyncio.sleep(0.01)
        cancel.set()
        assert await taking is None
        await asyncio.sleep(0.05)
        assert [h.disposed for h in backend.handles] == [True]

    asyncio.run(scenario())


def test_an_already_set_cancel_takes_nothing() -> None:
    async def scenario() -> None:
        backend = Backend()
        cancel = asyncio.Event()
        cancel.set()
        assert await _acquire(backend, cancel) is None
        assert backend.tasks == []

    asyncio.run(scenario())


def test_cancelling_the_caller_cancels_the_acquire() -> None:
    async def scenario() -> None:
        backend = Backend(wait=True)
        taking = asyncio.ensure_future(_acquire(backend, asyncio.Event()))
        await asyncio.sleep(0.01)
        taking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await taking
        await asyncio.sleep(0)
        assert isinstance(backend.saw, asyncio.CancelledError)
        assert backend.handles == []

    asyncio.run(scenario())
