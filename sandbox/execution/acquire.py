"""Taking a fresh sandbox for one execution, and giving the wait up when the caller leaves.

Usually a warm sandbox is idle and the acquire returns at once; it waits when the backend
starts one on demand, or when every room under `max_sandboxes` is taken
(`sandbox.backends.capacity`). A caller that cancels meanwhile (its client went away, or the
server's drain gave up on it) must not wait for that room: the acquire then runs in a task of
its own, which is cancelled (every step of a start is cancel-safe: a fork in flight is undone,
a room waited for is given back) and a sandbox that still arrives is disposed of.

The race costs two tasks and an `asyncio.wait` (~45 us of CPU under uvloop, ~65 under asyncio's
loop; ad hoc), which every served execution would pay for a wait that almost none has. So the
acquire is first stepped inline: a warm sandbox comes back without the coroutine ever
suspending, and only one that suspends is moved into a task (`_resumed` hands the task the
future it waits on) and raced against ``cancel``. Its first step therefore runs in the caller's
task and the rest in another: nothing on a backend's acquire path may bind itself to the
current task before its first wait (`asyncio.timeout` does; the process backend's start runs
its timeouts in a task of its own, `spawn_sandbox`).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, cast

from sandbox.backends.base import Backend, SandboxHandle
from sandbox.limits import ResolvedLimits

__all__ = ["acquire_sandbox", "acquire_unless_cancelled"]

_disposals: set[asyncio.Task[None]] = set()  # sandboxes nobody waited for, being disposed of


async def acquire_sandbox(
    backend: Backend, limits: ResolvedLimits, runtime: str | None
) -> SandboxHandle:
    """A fresh sandbox from ``backend``, in ``runtime`` when one is named (a runtime
    `check_runtime` let through: only backends that take runtimes get one)."""
    return await backend.acquire(limits, runtime)


async def acquire_unless_cancelled(
    backend: Backend,
    limits: ResolvedLimits,
    runtime: str | None,
    cancel: asyncio.Event | None,
) -> SandboxHandle | None:
    """`acquire_sandbox`, or None when ``cancel`` is set before a sandbox is there."""
    if cancel is None:
        return await acquire_sandbox(backend, limits, runtime)
    if cancel.is_set():
        return None
    coro = acquire_sandbox(backend, limits, runtime)
    try:
        pending = coro.send(None)
    except StopIteration as done:
        return cast(SandboxHandle, done.value)  # ready at once (a warm sandbox): no race
    except BaseException:
        coro.close()
        raise
    acquiring = asyncio.ensure_future(_resumed(coro, pending))
    cancelled = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((acquiring, cancelled), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        _abandon(acquiring)
        raise
    finally:
        cancelled.cancel()
    if acquiring.done():
        return acquiring.result()  # a sandbox, or the error that kept it from starting
    _abandon(acquiring)
    return None


@types.coroutine
def _resumed(
    coro: Coroutine[Any, Any, SandboxHandle], pending: Any
) -> Generator[Any, None, SandboxHandle]:
    """The rest of ``coro``, which suspended on ``pending`` in its first step, as an awaitable
    a task can run: the task waits on ``pending`` as ``coro`` would have, then resumes it; a
    cancellation delivered meanwhile is thrown into ``coro`` where it waits."""
    try:
        yield pending
    except BaseException as exc:
        try:
            pending = coro.throw(exc)
        except StopIteration as done:
            return cast(SandboxHandle, done.value)
        return (yield from _resumed(coro, pending))
    return (yield from coro.__await__())


def _abandon(acquiring: asyncio.Future[SandboxHandle]) -> None:
    """Stops an acquire nobody waits for any more; disposes of what it still delivers."""
    if not acquiring.done():
        acquiring.cancel()
    acquiring.add_done_callback(_dispose_delivered)


def _dispose_delivered(acquiring: asyncio.Future[SandboxHandle]) -> None:
    if acquiring.cancelled() or acquiring.exception() is not None:
        return
    task = asyncio.ensure_future(acquiring.result().dispose())
    _disposals.add(task)
    task.add_done_callback(_disposals.discard)
