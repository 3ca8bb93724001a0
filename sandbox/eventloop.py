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
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["loop_name", "new_event_loop", "run"]

T = TypeVar("T")
_CHOICES = ("auto", "uvloop", "asyncio")


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


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the chosen loop."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(coroutine)
