"""Which event loop the commands run on: uvloop's (libuv, in C) where it is installed, else
asyncio's own.

Why: the host side of an execution is mostly event-loop work (tasks, futures, callbacks,
readers on pipes, pidfds and sockets), and on asyncio's pure-Python loop that bookkeeping was
about a third of the host's CPU per execution. On uvloop the same code took about 0.5 ms less
host CPU per ``print(1)`` (`bench.forkserver`). The code runs unchanged on either loop: only
a command that owns its loop picks it (`ptc serve`; a one-shot `ptc run` would pay uvloop's
import for one execution). An application that embeds the `Engine` runs it on whatever loop it
runs; `new_event_loop` is there for it.

``PTC_EVENT_LOOP=asyncio`` forces asyncio's loop (for comparing, or should a problem ever be
uvloop's); ``uvloop`` requires it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["loop_name", "new_event_loop", "run"]

T = TypeVar("T")
_CHOICES = ("auto", "uvloop", "asyncio")
log = logging.getLogger(__name__)


def _uvloop() -> Any | None:
    choice = os.environ.get("PTC_EVENT_LOOP", "auto") or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"PTC_EVENT_LOOP must be one of {', '.join(_CHOICES)}, not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop `run` and `new_event_loop` give."""
    return "uvloop" if _uvloop() is not None else "asyncio"


def new_event_loop() -> asyncio.AbstractEventLoop:
    uvloop = _uvloop()
    loop: asyncio.AbstractEventLoop = (
        uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()
    )
    return loop


def run(coroutine: Coroutine[Any, Any, T], *, leftover_grace_s: float | None = None) -> T:
    """`asyncio.run` on the chosen loop.

    With ``leftover_grace_s``, tasks still running when ``coroutine`` returns are cancelled and
    get that long to end; those that do not (code that catches its CancelledError and goes on)
    are logged and left, where `asyncio.run` would wait for them for ever: a server whose stop
    has recorded and released everything must not hang at exit on one stubborn task."""
    if leftover_grace_s is None:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(coroutine)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        try:
            _end_leftovers(loop, leftover_grace_s)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _end_leftovers(loop: asyncio.AbstractEventLoop, grace_s: float) -> None:
    leftovers = asyncio.all_tasks(loop)
    if not leftovers:
        return
    for task in leftovers:
        task.cancel()
    _done, stuck = loop.run_until_complete(asyncio.wait(leftovers, timeout=grace_s))
    for task in leftovers - stuck:
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "task %s ended with an error at exit", _describe(task), exc_info=task.exception()
            )
    if stuck:
        log.error(
            "%d tasks did not end within %.1f s of their cancel at exit and are left: %s",
            len(stuck),
            grace_s,
            ", ".join(sorted(_describe(task) for task in stuck)),
        )


def _describe(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return f"{task.get_name()} ({getattr(coro, '__qualname__', type(coro).__name__)})"
