"""Taking a fresh sandbox for one execution, and giving the wait up when the caller leaves.

Usually a warm sandbox is idle and the acquire returns at once; it waits when the backend
starts one on demand, or when every room under `max_sandboxes` is taken
(`sandbox.backends.capacity`). A caller that cancels meanwhile (its client went away, or the
server's drain gave up on it) must not wait for that room: the acquire then runs in a task of
its own, which is cancelled (every step of a start is cancel-safe: a fork in flight is undone,
a room waited for is given back) and a sandbox that still arrives is disposed of.
"""

from __future__ import annotations

import asyncio

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
    acquiring = asyncio.ensure_future(acquire_sandbox(backend, limits, runtime))
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
