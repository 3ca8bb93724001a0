"""Every way a run can be stopped, as a table: a script prints three lines on stdout and three
on stderr (no flush), then trips one limit. The tests that use it (embedded, through `ptc
serve`, through an adapter) check that all six lines reach the result, whichever path took
the script.

A single-use kill is one of wall time, CPU time, memory (the OOM killer), processes (the
kernel refuses a thread) and protocol (a garbage frame on the tool channel); a session cell is
interrupted for its wall time (the session lives on), killed when it ignores the interrupt, or
taken by the OOM killer with its session.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KILLS", "LINES", "SESSION_KILLS", "STDERR_LINES", "STDOUT_LINES", "Kill"]

MiB = 1 << 20

LINES = (
    "import sys\n"
    "for word in ('one', 'two', 'three'):\n"
    "    print(word)\n"
    "    print('err', word, file=sys.stderr)\n"
)
STDOUT_LINES = "one\ntwo\nthree\n"
STDERR_LINES = "err one\nerr two\nerr three\n"

# The channel is the sandbox's only socket past stderr (fd 3 on the process backend; on Docker
# the bootstrap connected it after its output sockets).
GARBAGE_ON_THE_CHANNEL = (
    "import os, stat, time\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
    "            os.write(fd, b'\\x00\\x00\\x00\\x05hello')\n"
    "    except OSError:\n"
    "        pass\n"
    "time.sleep(600)\n"
)


@dataclass(frozen=True)
class Kill:
    limits: dict[str, int | float]
    trip: str  # runs after the lines
    violation: tuple[str, str]  # (limit, action) of the one violation
    ends_session: bool = False  # for a session cell: whether the session is lost

    def script(self, before_trip: str = "") -> str:
        return LINES + before_trip + self.trip


KILLS = {
    "wall_time": Kill({"wall_time": 2}, "import time\ntime.sleep(600)\n", ("wall_time", "killed")),
    "cpu_time": Kill({"cpu_time": 1}, "while True:\n    pass\n", ("cpu_time", "killed")),
    "memory": Kill(
        {"memory": 128 * MiB},
        "block = bytearray(160 * 1024 * 1024)\nblock[::4096] = b'x' * len(block[::4096])\n",
        ("memory", "killed"),
    ),
    # The sandbox's init, the guest and its channel thread count too (tests/conformance).
    "processes": Kill(
        {"processes": 24},
        "import threading\nev = threading.Event()\n"
        "ts = [threading.Thread(target=ev.wait) for _ in range(24)]\n"
        "try:\n    [t.start() for t in ts]\nfinally:\n    ev.set()\n",
        ("processes", "refused"),
    ),
    "protocol": Kill({}, GARBAGE_ON_THE_CHANNEL, ("protocol", "killed")),
}

SESSION_KILLS = {
    "interrupt": Kill(
        {"wall_time": 2}, "import time\ntime.sleep(600)\n", ("wall_time", "interrupted")
    ),
    "kill": Kill(
        {"wall_time": 2},
        "import time\nwhile True:\n    try:\n        time.sleep(600)\n"
        "    except KeyboardInterrupt:\n        pass\n",
        ("wall_time", "killed"),
        ends_session=True,
    ),
    "memory": Kill(
        {"memory": 128 * MiB},
        "block = bytearray(160 * 1024 * 1024)\nblock[::4096] = b'x' * len(block[::4096])\n",
        ("memory", "killed"),
        ends_session=True,
    ),
}
