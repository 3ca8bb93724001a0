"""A sandbox killed by the OOM killer of the cgroup the server runs in (the pod's limit, below
what the sandboxes together ask) is a `memory` violation with the kernel as evidence, and the
server goes on serving (issue 39: it ended `error`, "killed by signal 9", with no violation).

The server here is a degraded process backend (no cgroup per sandbox, as in the Kubernetes
base) in a real memory cgroup of 200 MiB made for the test, the pod; its sandbox may use 1 GiB
(RLIMIT_AS and the host's sum), and its script touches 400 MiB: the pod's limit is reached first
and the kernel kills the sandbox's process (each one volunteers, `oom_score_adj` 1000)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

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


def test_a_sandbox_killed_by_the_pods_oom_is_a_kernel_memory_violation(pod: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PTC_AUDIT_DB", "PTC_SERVER")}
    command = (
        f'echo $$ > {pod}/cgroup.procs && exec "$0" -m tests.backends.enclosing_oom_driver "$@"'
    )
    done = subprocess.run(
        ["sh", "-c", command, PYTHON, "memory=1073741824", "wall_time=30"],
        input=TOUCH_400_MIB,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    killed, after = (json.loads(line) for line in done.stdout.splitlines())
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
    control = (pod / "memory.oom_control").read_text()
    assert int(control.split("oom_kill ")[1].split()[0]) >= 1
    # The server was not the victim: it ran the next script.
    assert (after["status"], after["stdout"]) == ("ok", "1\n")
