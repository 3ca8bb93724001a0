"""The container backend gives the same evidence as the process backend where the engine runs on
this host: the cgroup's counters (read from the host) and the container's tmpfs usage (measured
through /proc/<init pid>/root). A script that raises a limit's error itself gets none.

Each test runs under runc and under runsc (gVisor, backend ``gvisor``). Where gVisor differs the
row says so: its /tmp and /dev/shm are gVisor's own tmpfs, which the host cannot measure, so a
full one is the guest's word (evidence `guest`, nothing observed); and gVisor's kernel does not
spare the script, its pid 1, from the signals it sends itself, so a self-sent SIGXCPU kills it
(an error, still no violation)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from sandbox.engine import ExecutionRequest, RunHooks
from sandbox.limits import parse_limit_args
from tests.memory_peaks import assert_memory_kill_peak

if TYPE_CHECKING:
    from tests.backends.docker.conftest import DockerHarness

MiB = 1 << 20


def test_host_reads_the_container(oclean: DockerHarness) -> None:
    result = oclean.run("print(1)")
    assert "cgroup:accounting" in result.isolation


CASES = {
    "file_size": (
        "with open('/tmp/f', 'wb') as f:\n    f.write(b'f' * (MiB + 1))".replace("MiB", str(MiB)),
        {"file_size": MiB},
        [("file_size", MiB, "refused", "host")],
    ),
    "dev-shm-full": (
        "i = 0\nwhile True:\n    with open(f'/dev/shm/f{i}', 'wb') as f:\n"
        "        f.write(b'd' * (1 << 20))\n    i += 1",
        {"file_size": 4 * MiB},
        [("file_size", 4 * MiB, "refused", "host")],
    ),
    "memory": (
        "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 1024 * 1024))",
        {"memory": 128 * MiB},
        [("memory", 128 * MiB, "killed", "kernel")],
    ),
    "open_files": (
        "files = [open('/dev/null') for _ in range(64)]",
        {"open_files": 32},
        [("open_files", None, "refused", "guest")],
    ),
}


# gVisor: the host cannot see into gVisor's tmpfs; the guest's report is all there is.
GVISOR_CASES = {
    "file_size": [("file_size", None, "refused", "guest")],
    "dev-shm-full": [("file_size", None, "refused", "guest")],
}


@pytest.mark.parametrize("name", list(CASES))
def test_real_violation_carries_its_evidence(oclean: DockerHarness, name: str) -> None:
    script, limits, expected = CASES[name]
    if oclean.backend.name == "gvisor":
        expected = GVISOR_CASES.get(name, expected)
    result = oclean.run(script, limits=limits)
    assert result.status == "limit_exceeded"
    found = [(v.limit, v.observed, v.action, v.evidence) for v in result.violations]
    if name == "memory":
        # The peak as `tests.memory_peaks` allows it (under gVisor a few pages over the limit);
        # the limit, the action and the evidence exact.
        assert len(found) == 1, found
        assert_memory_kill_peak(found[0][1], 128 * MiB, oclean.backend.name)
        found = [(found[0][0], 128 * MiB, found[0][2], found[0][3])]
    assert found == expected
    oclean.assert_healthy()


def test_memory_kill_is_read_while_the_loop_is_stalled(oclean: DockerHarness) -> None:
    # The engine removes an OOM-killed container's cgroup as soon as it sees the exit, and under
    # load that came before the event loop's own look at the exit: the peak was the last CPU
    # poll's (117 MiB of 128 in a CI run). Here the loop is held for the whole kill (the script's
    # first output blocks it for 3 s), so only the kernel's OOM notice, read on the OOM watch's
    # thread, can see the counters: before that watch the peak here was the guest's first few MiB.
    def stall(stream: str, data: bytes) -> None:
        if b"go" in data:
            time.sleep(3)

    script = "print('go', flush=True)\n" + CASES["memory"][0]
    request = ExecutionRequest(
        script=script,
        manifest="[]",
        limits=parse_limit_args([f"memory={128 * MiB}"]),
        backend=oclean.backend.name,
    )
    result = oclean.call(oclean.engine.execute(request, hooks=RunHooks(on_output=stall)))
    assert result.status == "limit_exceeded", (result.status, result.stderr)
    found = [(v.limit, v.action, v.evidence) for v in result.violations]
    assert found == [("memory", "killed", "kernel")]
    assert_memory_kill_peak(result.violations[0].observed, 128 * MiB, oclean.backend.name)
    oclean.assert_healthy()


SELF_SIGNAL = (
    "import os, signal\nsignal.signal(signal.{sig}, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.{sig})"
)


# (script, exit code under runc, exit code under gVisor). Under runc the script is its pid
# namespace's init (the container has no other): the signals RLIMIT_CPU and RLIMIT_FSIZE would
# send, sent by itself, are dropped by the kernel, and it ends ok. gVisor's kernel delivers them:
# the script dies of them, and that is still no violation.
SELF_MADE = {
    "memory-error": ("raise MemoryError", 1, 1),
    "emfile": ("raise OSError(24, 'Too many open files')", 1, 1),
    "efbig": ("raise OSError(27, 'File too large')", 1, 1),
    "enospc": ("raise OSError(28, 'No space left on device')", 1, 1),
    "eagain": ("raise BlockingIOError(11, 'Resource temporarily unavailable')", 1, 1),
    "eagain-through-exec": (
        "exec(\"raise BlockingIOError(11, 'Resource temporarily unavailable')\")",
        1,
        1,
    ),
    "sigxcpu-to-itself": (SELF_SIGNAL.format(sig="SIGXCPU"), 0, -24),
    "sigxfsz-to-itself": (SELF_SIGNAL.format(sig="SIGXFSZ"), 0, -25),
}


@pytest.mark.parametrize("name", list(SELF_MADE))
def test_self_made_refusal_is_an_error(oclean: DockerHarness, name: str) -> None:
    script, runc_exit, gvisor_exit = SELF_MADE[name]
    exit_code = gvisor_exit if oclean.backend.name == "gvisor" else runc_exit
    result = oclean.run(script, limits={"memory": 128 * MiB, "file_size": MiB})
    status = "error" if exit_code else "ok"
    assert (result.status, result.exit_code, result.violations) == (status, exit_code, [])
    oclean.assert_healthy()


def forged_end(error: dict[str, object]) -> str:
    """A script that sends the bootstrap's `end` frame itself on the container's channel (the
    bootstrap, `__main__`, keeps its fd), then exits as it claims."""
    report = {"t": "end", "status": "error", "exit_code": 1, "error": error}
    return (
        "import json, os, struct, sys\n"
        "fd = sys.modules['__main__'].CHANNEL_FD\n"
        f"body = json.dumps({report!r}).encode()\n"
        "os.write(fd, struct.pack('>I', len(body)) + body)\n"
        "os._exit(1)\n"
    )


EAGAIN = {"type": "BlockingIOError", "message": "", "line": 3, "errno": "EAGAIN"}


def test_forged_end_frame_claiming_a_refused_fork(oclean: DockerHarness) -> None:
    # The guest's mark of a refused process start is its word, like any report: under runc the
    # pids cgroup counted no refusal, so it is nothing; under gVisor, where only its kernel's
    # RLIMIT_NPROC counts the script's processes, it is a violation marked `guest` (as a forged
    # EMFILE is on every backend), with nothing observed.
    result = oclean.run(forged_end({**EAGAIN, "refused_by": "RLIMIT_NPROC"}))
    if oclean.backend.name == "gvisor":
        assert result.status == "limit_exceeded"
        assert [(v.limit, v.observed, v.action, v.evidence) for v in result.violations] == [
            ("processes", None, "refused", "guest")
        ]
    else:
        assert (result.status, result.violations) == ("error", [])
    # Without the mark, EAGAIN is what non-blocking I/O raises: nothing on any runtime.
    result = oclean.run(forged_end(EAGAIN))
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    oclean.assert_healthy()
