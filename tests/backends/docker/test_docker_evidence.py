"""The container backend gives the same evidence as the process backend where the engine runs on
this host: the cgroup's counters (read from the host) and the container's tmpfs usage (measured
through /proc/<init pid>/root). A script that raises a limit's error itself gets none."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from conftest import DockerHarness

MiB = 1 << 20


def test_host_reads_the_container(dclean: DockerHarness) -> None:
    result = dclean.run("print(1)")
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


@pytest.mark.parametrize("name", list(CASES))
def test_real_violation_carries_its_evidence(dclean: DockerHarness, name: str) -> None:
    script, limits, expected = CASES[name]
    result = dclean.run(script, limits=limits)
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.observed, v.action, v.evidence) for v in result.violations] == expected
    dclean.assert_healthy()


SELF_SIGNAL = (
    "import os, signal\nsignal.signal(signal.{sig}, signal.SIG_DFL)\n"
    "os.kill(os.getpid(), signal.{sig})"
)


@pytest.mark.parametrize(
    ("script", "exit_code"),
    [
        ("raise MemoryError", 1),
        ("raise OSError(24, 'Too many open files')", 1),
        ("raise OSError(27, 'File too large')", 1),
        ("raise OSError(28, 'No space left on device')", 1),
        # The script is its pid namespace's init (the container has no other): the signals
        # RLIMIT_CPU and RLIMIT_FSIZE would send, sent by itself, are ignored, and it ends ok.
        (SELF_SIGNAL.format(sig="SIGXCPU"), 0),
        (SELF_SIGNAL.format(sig="SIGXFSZ"), 0),
    ],
)
def test_self_made_refusal_is_an_error(dclean: DockerHarness, script: str, exit_code: int) -> None:
    result = dclean.run(script, limits={"memory": 128 * MiB, "file_size": MiB})
    status = "error" if exit_code else "ok"
    assert (result.status, result.exit_code, result.violations) == (status, exit_code, [])
    dclean.assert_healthy()
