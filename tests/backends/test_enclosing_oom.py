"""A sandbox killed by the OOM killer of the cgroup the server runs in (the pod's limit, below
what the sandboxes together ask) is a `memory` violation with the kernel as evidence, and the
server goes on serving (issue 39: it ended `error`, "killed by signal 9", with no violation).

The server here is a degraded process backend (no cgroup per sandbox, as in the Kubernetes
base) in a real memory cgroup of 200 MiB made for the test, the pod; its sandbox may use 1 GiB
(RLIMIT_AS and the host's sum), and its script touches 400 MiB: the pod's limit is reached first
and the kernel kills the sandbox's process (each one volunteers, `oom_score_adj` 1000). When the
process killed is a child the script survives, the host ties the kill to the sandbox by time
(`sandbox.backends.process.oom_victims`); a child the script kills itself is no violation."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ptc_cli import PYTHON, ROOT

pytestmark = pytest.mark.requires_bwrap

MEMORY_V1 = Path("/sys/fs/cgroup/memory")
POD_LIMIT = 200 * 1024 * 1024
TOUCH_400_MIB = (
    "block = bytearray(400 * 1024 * 1024)\n"
    "for i in range(0, len(block), 4096):\n"
    "    block[i] = 1\n"
    "print('survived')\n"
)


# The script survives: its child touches 400 MiB and is killed; the script reports and goes on.
# The child lives 0.2 s first: the host ties the kill to a process its samples saw (a process
# born, killed and reaped between two 50 ms samples is not seen, docs/limits.md).
CHILD_TOUCHES_400_MIB = f"""
import subprocess, sys, time
child = subprocess.run(
    [sys.executable, "-c", "import time; time.sleep(0.2)\\n" + {TOUCH_400_MIB!r}],
    capture_output=True,
)
time.sleep(0.3)
print("child", child.returncode, child.stdout)
"""
# The script kills its own child with SIGKILL: no OOM kill, no violation.
CHILD_KILLED_BY_SCRIPT = """
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
time.sleep(0.2)
child.send_signal(signal.SIGKILL)
time.sleep(0.3)
print("child", child.wait())
"""


@pytest.fixture
def pod() -> Iterator[Path]:
    """A v1 memory cgroup with a limit and no swap beyond it, removed after the test."""
    if not (MEMORY_V1 / "cgroup.procs").exists() or not os.access(MEMORY_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory hierarchy to make a pod's limit")
    group = MEMORY_V1 / f"ptc-test-pod-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(POD_LIMIT))
        memsw = group / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(POD_LIMIT))
        yield group
    finally:
        group.rmdir()


def _in_the_pod(pod: Path, script: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The driver run in ``pod``: the script's result, then the next `print(1)`'s."""
    env = {k: v for k, v in os.environ.items() if k not in ("PTC_AUDIT_DB", "PTC_SERVER")}
    command = (
        f'echo $$ > {pod}/cgroup.procs && exec "$0" -m tests.backends.enclosing_oom_driver "$@"'
    )
    done = subprocess.run(
        ["sh", "-c", command, PYTHON, "memory=1073741824", "wall_time=30"],
        input=script,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    first, after = (json.loads(line) for line in done.stdout.splitlines())
    return first, after


def _pod_oom_kills(pod: Path) -> int:
    control = (pod / "memory.oom_control").read_text()
    return int(control.split("oom_kill ")[1].split()[0])


def test_a_sandbox_killed_by_the_pods_oom_is_a_kernel_memory_violation(pod: Path) -> None:
    killed, after = _in_the_pod(pod, TOUCH_400_MIB)
    assert killed["status"] == "limit_exceeded", killed
    assert "survived" not in killed["stdout"]
    [violation] = killed["violations"]
    assert (violation["limit"], violation["action"], violation["evidence"]) == (
        "memory",
        "killed",
        "kernel",
    )
    assert violation["limit_value"] == 1073741824
    assert (
        "the cgroup enclosing the server (the pod or container) ran out of memory"
        in (violation["detail"])
    )
    # The kernel counted it: the pod's own counter.
    assert _pod_oom_kills(pod) >= 1
    # The server was not the victim: it ran the next script.
    assert (after["status"], after["stdout"]) == ("ok", "1\n")


def test_a_child_killed_by_the_pods_oom_is_reported_though_the_script_survives(pod: Path) -> None:
    survived, after = _in_the_pod(pod, CHILD_TOUCHES_400_MIB)
    assert (survived["status"], survived["stdout"]) == ("limit_exceeded", "child -9 b''\n")
    [violation] = survived["violations"]
    assert (violation["limit"], violation["action"], violation["evidence"]) == (
        "memory",
        "killed",
        "kernel",
    )
    assert violation["limit_value"] == 1073741824
    assert violation["detail"].startswith(
        "the kernel's OOM killer killed 1 of the sandbox's processes other than its first: the"
        " cgroup enclosing the server (the pod or container) ran out of memory (1 OOM kills there"
    ), violation
    assert _pod_oom_kills(pod) == 1
    assert (after["status"], after["stdout"], after["violations"]) == ("ok", "1\n", [])


def test_a_child_the_script_kills_itself_is_no_violation(pod: Path) -> None:
    """The negative control: the same SIGKILL death of a child, without an OOM kill."""
    survived, after = _in_the_pod(pod, CHILD_KILLED_BY_SCRIPT)
    assert (survived["status"], survived["stdout"]) == ("ok", "child -9\n"), survived
    assert survived["violations"] == []
    assert _pod_oom_kills(pod) == 0
    assert (after["status"], after["stdout"]) == ("ok", "1\n")
