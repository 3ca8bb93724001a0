"""``ptc serve`` with a profiler it switches on and off by signal (`bench.serve_profile`'s).

Run as a script, not a module: ``python bench/_serve_profiled.py OUT serve ARGS...`` with
``PYTHONPATH`` naming the checkout to serve from, so that another revision's server runs under
the same wrapper. Until `START` it is plain ``ptc serve``; `START` starts a `cProfile` of the
main thread (the event loop's) timed by that thread's CPU clock (`time.thread_time`), and
`STOP` stops it and writes its stats to ``OUT`` (`pstats` format), then writes ``OUT.done``.
Real-time signals, since ``ptc serve`` itself answers SIGUSR1 (it writes its stacks).
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

START = signal.SIGRTMIN + 1
STOP = signal.SIGRTMIN + 2

# This file's directory is the script's sys.path[0]: bench/grpc.py there would shadow gRPC.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    profiler = cProfile.Profile(time.thread_time)

    def start(_signum: int, _frame: FrameType | None) -> None:
        profiler.enable()

    def dump(_signum: int, _frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(out)
        Path(out + ".done").write_text(str(os.getpid()))

    # Python runs these handlers in the main thread, the one the event loop runs on.
    signal.signal(START, start)
    signal.signal(STOP, dump)
    from sandbox.cli import main as ptc

    return ptc(argv)


if __name__ == "__main__":
    raise SystemExit(main())
