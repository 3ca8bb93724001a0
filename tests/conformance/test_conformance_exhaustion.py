"""Hostile scripts that try to exhaust the host, on every backend: processes, threads, memory,
CPU, time, output, disk, the stack. Each trips exactly the limit it attacks (named, with its
value and the action) and leaves nothing behind; the engine serves the next execution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.memory_peaks import assert_memory_kill_peak

if TYPE_CHECKING:
    from sandbox.result import ExecutionResult

    from .conftest import Harness

MiB = 1 << 20


def tripped(result: ExecutionResult) -> list[tuple[str, float, str]]:
    return [(v.limit, v.limit_value, v.action) for v in result.violations]


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
# Under gVisor (runsc) the container's pids cgroup holds gVisor's own kernel as well, so the
# script's `processes` limit is enforced inside gVisor (RLIMIT_NPROC) and the host's pids cgroup
# is only a backstop (`sandbox.backends.docker.spec.host_pids_limit`). A fork only gVisor refused
# is seen by the guest alone, and the bomb swallows it: nothing to report. Under fork pressure
# gVisor's Go runtime may start more threads of its own than the backstop allows for; when the
# host refuses one, gVisor dies (exit code 2) and the host reports the refusal. So under gVisor
# the bomb either spins until the deadline or ends with gVisor at the backstop, each exactly as
# below. It runs there with 4 processes, not 32: on the ptrace platform every guest process has
# a stub process and 8-10 gVisor threads on the host, and 32 of them starve a 2-core engine (or,
# at the default memory limit, end as a `memory` kill instead).
GVISOR_FORK_BOMB_OUTCOMES: dict[int, list[tuple[str, float, str]]] = {
    -9: [("wall_time", 2.0, "killed")],  # every time here with 4 processes (and with 6)
    2: [("processes", 4, "refused")],  # gVisor at the backstop: half the runs here with 8
}


def test_fork_bomb(clean: Harness) -> None:
    processes = 4 if clean.name == "gvisor" else 32
    result = clean.run(FORK_BOMB, limits={"wall_time": 2, "processes": processes})
    assert result.status == "limit_exceeded", result.to_json()
    if clean.name != "gvisor":
        # The bomb spins until the deadline; the pids cgroup refused every fork past 32.
        assert tripped(result) == [("wall_time", 2.0, "killed"), ("processes", 32, "refused")]
        assert result.exit_code == -9
    else:
        assert result.exit_code in GVISOR_FORK_BOMB_OUTCOMES, result.to_json()
        expected = GVISOR_FORK_BOMB_OUTCOMES[result.exit_code]
        # The deadline may also have passed before gVisor died at the backstop.
        also_late = [("wall_time", 2.0, "killed"), *expected] if result.exit_code == 2 else None
        assert tripped(result) in (expected, also_late), result.to_json()
        evidence = {v.limit: v.evidence for v in result.violations}
        assert evidence.get("wall_time", "host") == "host"
        assert evidence.get("processes", "kernel") == "kernel"  # the host's pids cgroup
    # The host's deadline held: the bomb did not delay the kill.
    wall = [v.observed or 0 for v in result.violations if v.limit == "wall_time"]
    assert all(2.0 <= observed < 5.0 for observed in wall), wall
    clean.assert_healthy()


def test_thread_bomb(clean: Harness) -> None:
    result = clean.run(
        """
import threading, time
threads = []
while True:
    t = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    t.start()
    threads.append(t)
""",
        limits={"processes": 40},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("processes", 40, "refused")]
    # Under gVisor only its kernel (RLIMIT_NPROC) saw the refusal, not the host.
    assert result.violations[0].evidence == ("guest" if clean.name == "gvisor" else "kernel")
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("RuntimeError", "can't start new thread")
    clean.assert_healthy()


# Forks until one is refused, each child asleep so that all count at once; the refusal is not
# caught. 16 processes, of which the guest and its channel thread take two (and under gVisor,
# whose RLIMIT_NPROC counts tasks, the script's threads too): a dozen or so sleeping children.
FORK_UNTIL_REFUSED = """
import os, time
while True:
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
"""


def test_refused_fork_is_reported(clean: Harness) -> None:
    result = clean.run(FORK_UNTIL_REFUSED, limits={"processes": 16})
    assert result.status == "limit_exceeded", result.to_json()
    assert tripped(result) == [("processes", 16, "refused")]
    violation = result.violations[0]
    if clean.name == "gvisor":
        # Only gVisor's kernel (RLIMIT_NPROC) refused, and only the guest saw it come out of
        # `os.fork`: the guest's word, nothing observed (the host's pids cgroup, a backstop
        # that also holds gVisor's own threads, was not reached).
        assert (violation.evidence, violation.observed) == ("guest", None)
        assert violation.detail == "the script reported a process start refused at the limit"
    else:
        assert violation.evidence == "kernel"  # the pids cgroup's own count of refusals
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("BlockingIOError", 4)
    assert result.error.message == "[Errno 11] Resource temporarily unavailable"
    clean.assert_healthy()


def test_memory_bomb_in_one_process(clean: Harness) -> None:
    result = clean.run(
        "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 1024 * 1024))",
        limits={"memory": 128 * MiB},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("memory", 128 * MiB, "killed")]
    assert_memory_kill_peak(result.violations[0].observed, 128 * MiB, clean.name)
    assert result.exit_code == -9
    clean.assert_healthy()


def test_memory_bomb_spread_over_processes(clean: Harness) -> None:
    # Each child stays far below the limit; together they are over it: the limit is the
    # sandbox's as a whole, not per process.
    result = clean.run(
        """
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = bytearray(48 * 1024 * 1024)
        time.sleep(30)
        os._exit(0)
time.sleep(30)
""",
        limits={"memory": 128 * MiB, "wall_time": 5},
    )
    assert result.status == "limit_exceeded"
    assert ("memory", 128 * MiB, "killed") in tripped(result)
    clean.assert_healthy()


def test_busy_loop(clean: Harness) -> None:
    result = clean.run("while True:\n    pass", limits={"cpu_time": 1})
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("cpu_time", 1.0, "killed")]
    assert (result.violations[0].observed or 0.0) >= 1.0, result.to_json()
    assert result.exit_code == -9
    clean.assert_healthy()


def test_busy_loop_over_several_processes_counts_them_together(clean: Harness) -> None:
    result = clean.run(
        "import os\nfor _ in range(3):\n    os.fork()\nwhile True:\n    pass",
        limits={"cpu_time": 1, "wall_time": 20},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("cpu_time", 1.0, "killed")]
    clean.assert_healthy()


def test_sleep_past_the_wall_limit(clean: Harness) -> None:
    result = clean.run(
        "import time\nprint('before', flush=True)\ntime.sleep(60)", limits={"wall_time": 1}
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("wall_time", 1.0, "killed")]
    assert (result.violations[0].observed or 0.0) >= 1.0, result.to_json()
    assert result.stdout == "before\n"
    assert result.exit_code == -9
    clean.assert_healthy()


FLOODS = {
    "stdout-lines": ("import sys\nfor _ in range(1024):\n    print('x' * 1023)", "stdout"),
    "stdout-no-newline": ("import sys\nsys.stdout.write('y' * (1 << 20))", "stdout"),
    "stdout-binary-os-write": (
        "import os\nfor _ in range(4096):\n    os.write(1, bytes(range(256)))",
        "stdout",
    ),
    "stderr-lines": (
        "import sys\nfor _ in range(1024):\n    print('x' * 1023, file=sys.stderr)",
        "stderr",
    ),
    "stderr-no-newline": ("import sys\nsys.stderr.write('y' * (1 << 20))", "stderr"),
    "stderr-binary-os-write": (
        "import os\nfor _ in range(4096):\n    os.write(2, bytes(range(256)))",
        "stderr",
    ),
}


@pytest.mark.parametrize("name", list(FLOODS))
def test_output_flood_is_cut_with_a_marker(clean: Harness, name: str) -> None:
    script, stream = FLOODS[name]
    cap = 64 * 1024
    result = clean.run(script, limits={f"{stream}_bytes": cap})
    assert result.status == "limit_exceeded"
    assert tripped(result) == [(f"{stream}_bytes", cap, "truncated")]
    assert result.violations[0].observed == MiB
    dropped = MiB - cap
    text = result.stdout if stream == "stdout" else result.stderr
    assert text.endswith(
        f"\n[ptc: {stream} truncated: {dropped} bytes dropped of {MiB}; the cap is {cap} bytes]\n"
    )
    assert getattr(result.usage, f"{stream}_bytes") == MiB
    clean.assert_healthy()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_endless_output_flood_is_killed_at_the_deadline(clean: Harness, stream: str) -> None:
    fd = 1 if stream == "stdout" else 2
    result = clean.run(
        f"import os\nwhile True:\n    os.write({fd}, b'z' * 65536)",
        limits={"wall_time": 1, f"{stream}_bytes": 4096},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("wall_time", 1.0, "killed"), (f"{stream}_bytes", 4096, "truncated")]
    text = result.stdout if stream == "stdout" else result.stderr
    assert text.startswith("z" * 4096 + f"\n[ptc: {stream} truncated: ")
    clean.assert_healthy()


# /dev/shm is a tmpfs of its own, sized like /tmp (both are charged to the memory cgroup too).
@pytest.mark.parametrize("directory", ["/tmp", "/dev/shm"])
def test_disk_fill_stops_at_file_size(clean: Harness, directory: str) -> None:
    result = clean.run(
        f"""
i = 0
while True:
    with open(f"{directory}/fill{{i}}", "wb") as f:
        f.write(b"d" * (1 << 20))
    i += 1
""",
        limits={"file_size": 4 * MiB},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("file_size", 4 * MiB, "refused")]
    assert result.error is not None
    assert result.error.type == "OSError"
    assert "No space left on device" in result.error.message
    clean.assert_healthy()


def test_one_file_bigger_than_the_limit(clean: Harness) -> None:
    result = clean.run(
        "with open('/tmp/big', 'wb') as f:\n    f.write(b'x' * (2 * 1024 * 1024))",
        limits={"file_size": MiB},
    )
    assert result.status == "limit_exceeded"
    assert tripped(result) == [("file_size", MiB, "refused")]
    clean.assert_healthy()


def test_deep_recursion(clean: Harness) -> None:
    result = clean.run("def f(n):\n    return f(n + 1) + 1\n\nf(0)")
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("RecursionError", 2)
    clean.assert_healthy()


def test_deep_recursion_with_the_guard_removed(clean: Harness) -> None:
    result = clean.run(
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\n\nf(0)",
        limits={"memory": 128 * MiB},
    )
    # Python 3.11 keeps frames on the heap: unbounded recursion is a memory bomb.
    seen = (result.status, result.exit_code, result.violations, result.stderr[-800:])
    assert result.status == "limit_exceeded", seen
    assert tripped(result) == [("memory", 128 * MiB, "killed")], seen
    clean.assert_healthy()


def test_raising_own_limits_fails(clean: Harness) -> None:
    result = clean.run(
        """
import resource
for name in ("RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE"):
    which = getattr(resource, name)
    soft, hard = resource.getrlimit(which)
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print(name, "raised")
    except (ValueError, OSError) as exc:
        print(name, type(exc).__name__)
"""
    )
    assert result.status == "ok"
    assert result.stdout.splitlines() == [
        "RLIMIT_CPU ValueError",
        "RLIMIT_NOFILE ValueError",
        "RLIMIT_FSIZE ValueError",
    ]
    clean.assert_healthy()


REFUSAL_LOOKALIKES = {
    # The script raises a refused thread's error itself: no kernel refused anything.
    "raised-thread-error": (
        'raise RuntimeError("can\'t start new thread")',
        ("RuntimeError", "can't start new thread", 1),
    ),
    # Non-blocking I/O raises what a refused fork raises (EAGAIN): not a processes violation.
    "non-blocking-read": (
        "import socket\na, b = socket.socketpair()\na.setblocking(False)\na.recv(1)",
        ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", 4),
    ),
    # A refused fork's error, made up by the script: raised at its own `raise`, ...
    "raised-fork-error": (
        "raise BlockingIOError(11, 'Resource temporarily unavailable')",
        ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", 1),
    ),
    # ... or, right after a fork that succeeded, from code it made at run time (no `raise` at
    # the reported line): it did not come out of the fork, so the guest does not mark it.
    "fork-then-exec-raised": (
        "import os\nif os.fork() == 0:\n    os._exit(0)\nos.wait()\n"
        "exec(\"raise BlockingIOError(11, 'Resource temporarily unavailable')\")",
        ("BlockingIOError", "[Errno 11] Resource temporarily unavailable", 5),
    ),
}


@pytest.mark.parametrize("name", list(REFUSAL_LOOKALIKES))
def test_refusal_lookalikes_are_no_violation(clean: Harness, name: str) -> None:
    script, (kind, message, line) = REFUSAL_LOOKALIKES[name]
    result = clean.run(script, limits={"processes": 16})
    assert (result.status, result.violations) == ("error", [])
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == (kind, message, line)
    clean.assert_healthy()
