"""What a running server is waiting on, written to stderr on request (`kill -USR1 <pid>` to
`ptc serve`): every thread's stack and every asyncio task's.

A server that stops answering, or whose stop does not end, is usually waiting on something: a
room under `max_sandboxes`, a fork reply, a store. Threads alone show the event loop in its
poll; the tasks show which await each execution is in, down the whole chain of awaits (a
suspended task's own stack is one frame). Read-only and cheap enough to run on a
live server; nothing is changed or cancelled.
"""

from __future__ import annotations

import asyncio
import faulthandler
import sys
import time
from types import FrameType
from typing import TextIO

__all__ = ["dump_stacks"]

TASK_FRAMES = 12  # innermost frames per task: enough to see the await it is in


def dump_stacks(out: TextIO | None = None) -> None:
    """Writes the threads' stacks, then the tasks' of the running loop (if any)."""
    out = out or sys.stderr
    out.write(f"--- ptc stacks at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n")
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop in this thread
        tasks = set()
    out.write(f"--- {len(tasks)} asyncio tasks ---\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
        out.write(f"task {task.get_name()} ({name}):\n")
        for frame in awaited_frames(coro)[-TASK_FRAMES:]:
            code = frame.f_code
            out.write(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
        # What the task is parked on. Futures' C iterator does not expose its future, so the
        # task's own record of it is read (private to asyncio, read-only, both implementations).
        waited = getattr(task, "_fut_waiter", None)
        if waited is not None:
            out.write(f"  awaiting {_describe(waited)}\n")
    out.write("--- end of stacks ---\n")
    out.flush()


def awaited_frames(coro: object) -> list[FrameType]:
    """The frames of a suspended coroutine and of every coroutine it awaits, outermost first.

    `Task.get_stack` gives a suspended task one frame, its own coroutine's: the await it is
    stuck in may be ten calls down. The chain is followed through `cr_await` (coroutines),
    `gi_yieldfrom` (generator-based awaitables) and `ag_await` (async generators)."""
    frames: list[FrameType] = []
    current: object = coro
    for _ in range(256):  # a cycle cannot happen in a live chain; bound it anyway
        frame = _frame_of(current)
        if frame is None:
            break
        frames.append(frame)
        current = _awaits(current)
        if current is None:
            break
    return frames


def _frame_of(obj: object) -> FrameType | None:
    for attribute in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(obj, attribute, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None


def _awaits(obj: object) -> object | None:
    for attribute in ("cr_await", "gi_yieldfrom", "ag_await"):
        awaited: object | None = getattr(obj, attribute, None)
        if awaited is not None:
            return awaited
    return None


def _describe(awaitable: object) -> str:
    if isinstance(awaitable, asyncio.Task):
        return f"task {awaitable.get_name()}"
    return type(awaitable).__qualname__
