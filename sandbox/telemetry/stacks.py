"""What a running server is waiting on, written to stderr on request (`kill -USR1 <pid>` to
`ptc serve`): every thread's stack and every asyncio task's.

A server that stops answering, or whose stop does not end, is usually waiting on something: a
room under `max_sandboxes`, a fork reply, a store. Threads alone show the event loop in its
poll; the tasks show which await each execution is in. Read-only and cheap enough to run on a
live server; nothing is changed or cancelled.
"""

from __future__ import annotations

import asyncio
import faulthandler
import sys
import time
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
        for frame in task.get_stack(limit=TASK_FRAMES):
            code = frame.f_code
            out.write(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
    out.write("--- end of stacks ---\n")
    out.flush()
