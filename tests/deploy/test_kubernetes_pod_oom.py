"""The pod's own OOM, in the server image with the base's exact container settings (the
`pod` fixture, `k8s_pod.Pod`): sandboxes each within their own limits pass the pod's limit
together, and the kernel's OOM killer, not our `memory` limit, takes a sandbox process; and
two pods sharing the host's sandbox uids.

The server sizes `max_sandboxes` at start so that its sandboxes at their ceiling fit the pod
(12 x 256 MiB + 1 GiB in 4 GiB, `sandbox.server.memory_budget`), so the OOM test lowers the
pod's limit once the server is ready, as Kubernetes' in-place resize of a running pod does (the
kubelet updates the container's cgroup; here `docker update`): the way an operator overcommits
a pod past the server's arithmetic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.backends.test_uid_per_sandbox import HOLDING_BOMB, NEIGHBOUR, NEIGHBOUR_OUT
from tests.deploy.conftest import running
from tests.deploy.k8s_pod import Pod
from tests.deploy.k8s_variants import probe_budget_s
from tests.deploy.variants_table import Outcomes, violation_text
from tests.server_image import docker

pytestmark = [pytest.mark.requires_docker, pytest.mark.timeout(300)]


def _ready(pod: Pod) -> None:
    started = pod.start()
    serving = pod.wait_serving(False, started + probe_budget_s(pod.spec["startupProbe"]))
    pod.wait_serving(True, serving + probe_budget_s(pod.spec["readinessProbe"]))


# Grows to 200 MiB in steps of 10 MiB, every 20 ms (under its own 256 MiB limit, the host's sum
# and RLIMIT_AS alike), holds it 4 s, then says so. GROW_IN_A_CHILD does it in a child process
# and reports how the child ended: the script survives the child's kill.
GROWER = """
import time
chunks = []
for _ in range(20):
    block = bytearray(10 * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    chunks.append(block)
    time.sleep(0.02)
time.sleep(4)
print("held")
"""
GROW_IN_A_CHILD = f"""
import subprocess, sys, time
child = subprocess.run([sys.executable, "-c", {GROWER!r}], capture_output=True, text=True)
time.sleep(0.3)
print("child", child.returncode, child.stdout.strip())
"""
GROWERS = 4
GROWN_BYTES = 200 * 1024**2
# The pod's limit above what the server and its warm pool use before the growers start: room for
# 3.5 growers, less what their `ptc run` clients (started by `docker exec`, in the container's
# cgroup too) and the pool's refills take, so that the four together pass it; the kernel kills
# until the rest fit (two of the four in each run so far, the table's memory row).
POD_ROOM_BYTES = 700 * 1024**2
KERNEL_KILL_DETAIL = {
    GROWER: "the kernel's OOM killer killed the sandbox: the cgroup enclosing the server (the"
    " pod or container) ran out of memory",
    GROW_IN_A_CHILD: "the kernel's OOM killer killed 1 of the sandbox's processes other than"
    " its first: the cgroup enclosing the server (the pod or container) ran out of memory",
}
HELD_STDOUT = {GROWER: "held\n", GROW_IN_A_CHILD: "child 0 held\n"}


def _growers_past_the_pod(pod: Pod, script: str) -> list[dict[str, Any]]:
    """Four sandboxes, each growing to 200 MiB under its own 256 MiB limit, side by side, past
    the pod's lowered limit; their results, after checking each one is either untouched or a
    kernel `memory` violation, as many of the latter as the pod's OOM kills."""
    kills_before = pod.oom_kills()
    results = [pod.finished(run) for run in [pod.started(script) for _ in range(GROWERS)]]
    killed = [r for r in results if r["status"] != "ok"]
    for result in results:
        if result["status"] == "ok":  # a neighbour of the kill: untouched
            assert (result["stdout"], result["violations"]) == (HELD_STDOUT[script], []), result
            continue
        assert result["status"] == "limit_exceeded", result
        (violation,) = result["violations"]
        assert (violation["limit"], violation["action"], violation["evidence"]) == (
            "memory",
            "killed",
            "kernel",
        ), violation
        assert violation["limit_value"] == 256 * 1024**2
        assert violation["detail"].startswith(KERNEL_KILL_DETAIL[script]), violation
        if script == GROW_IN_A_CHILD:  # the script went on and said how its child ended
            assert result["stdout"] == "child -9 \n", result
    assert killed, "the growers passed the pod's limit and nothing was killed"
    assert len(killed) == pod.oom_kills() - kills_before, results
    return results


@pytest.mark.parametrize("pod", ["base"], indirect=True)
def test_in_the_base_a_sandbox_killed_by_the_pods_oom_is_a_kernel_memory_violation(
    pod: Pod,
) -> None:
    """The pod's memory limit below what its sandboxes together ask: each sandbox grows within
    its own limit, the four together pass the pod's, and the kernel's OOM killer takes a sandbox
    process (each volunteers, `oom_score_adj` 1000). The sandbox it took ends `limit_exceeded`
    with a `memory` violation, evidence `kernel`, whether the process was its first (the
    script dies) or a child (the script goes on); the others end untouched, and the server
    stays ready. The pod's limit is lowered once the server is ready (the module's docstring
    says why)."""
    _ready(pod)
    directory = pod.memory_cgroup()
    limit = int((directory / "memory.usage_in_bytes").read_text()) + POD_ROOM_BYTES
    assert GROWERS * GROWN_BYTES > POD_ROOM_BYTES > (GROWERS - 1) * GROWN_BYTES
    resized = docker("update", "--memory", str(limit), "--memory-swap", str(limit), pod.name)
    assert resized.returncode == 0, resized.stderr
    assert int((directory / "memory.limit_in_bytes").read_text()) == limit

    outcomes = Outcomes("base")
    outcomes.saw("pod_oom_limit_mib", limit >> 20, figure=True)
    hit: list[str] = []
    for script, key in ((GROWER, "pod_oom_first"), (GROW_IN_A_CHILD, "pod_oom_child")):
        results = _growers_past_the_pod(pod, script)
        statuses = [r["status"] for r in results]
        print(f"base: 4 x 200 MiB ({key}) in a pod of {limit >> 20} MiB: {statuses}")
        assert pod.health(True) == "SERVING"
        (killed,) = {violation_text(r) for r in results if r["status"] != "ok"}
        outcomes.saw(key, killed)
        others = {violation_text(r) for r in results if r["status"] == "ok"}
        if others:
            outcomes.saw("pod_oom_others", others.pop())
        hit.append(str(statuses.count("limit_exceeded")))
    outcomes.saw("pod_oom_hit", ", then ".join(hit), figure=True)

    returncode, result = pod.run("print(6 * 7)\n")
    assert (returncode, result["stdout"]) == (0, "42\n"), result
    assert docker("exec", pod.name, "cat", "/proc/1/oom_score_adj").stdout == "0\n"
    restarts = docker("inspect", "-f", "{{.RestartCount}}", pod.name).stdout.strip()
    assert (pod.state("Running"), restarts) == ("true", "0")


@pytest.mark.parametrize("pod", ["base"], indirect=True)
def test_two_pods_giving_the_same_sandbox_uid_do_not_share_its_process_count(
    pod: Pod, tmp_path: Path
) -> None:
    """Two servers in separate containers, both root in the node's user namespace (Docker's, as
    the privileged overlay has), give sandboxes from the same host uids, and neither sees the
    other's claims (`uid_claims`). RLIMIT_NPROC still counts each sandbox alone: since Linux
    5.14 the kernel counts processes per user namespace and uid, and each server's zygote has a
    user namespace of its own. So one pod's fork bomb holding its 63 processes at uid X leaves
    another pod's 8 threads and 4 subprocesses at the same uid X untouched."""
    (tmp_path / "other").mkdir()
    with running("base", tmp_path / "other") as other:
        _ready(pod)
        _ready(other)
        # Each pod gives its uids in its own order (its warm pool's): until the two land on
        # one uid, the pod that gave the lower one gives another first.
        for _attempt in range(ALIGN_ATTEMPTS):
            bomb, beside = _bomb_beside_threads(pod, other)
            assert (bomb["status"], bomb["stdout"]) == ("limit_exceeded", "63\n"), bomb
            assert [v["limit"] for v in bomb["violations"]] == ["processes"], bomb
            assert (beside["status"], beside["stdout"], beside["violations"]) == (
                "ok",
                NEIGHBOUR_OUT,
                [],
            ), beside
            if _uid(bomb) == _uid(beside):
                break
            behind = pod if _uid(bomb) < _uid(beside) else other
            assert behind.run("print(1)")[1]["status"] == "ok"
        else:
            pytest.fail(f"the two pods never gave one uid at once in {ALIGN_ATTEMPTS} attempts")
        print(f"base: two pods, a fork bomb and 8 threads + 4 subprocesses both as {_uid(bomb)}")
        Outcomes("base").saw("two_pods_same_uid", violation_text(beside))
        for each in (pod, other):
            assert each.health(True) == "SERVING"


ALIGN_ATTEMPTS = 6


def _bomb_beside_threads(pod: Pod, other: Pod) -> tuple[dict[str, Any], dict[str, Any]]:
    """A fork bomb (processes 64) in ``pod`` while ``other`` runs 8 threads and 4
    subprocesses: their two results."""
    neighbour = other.started(NEIGHBOUR)
    bomb = pod.run(HOLDING_BOMB, "processes=64", "wall_time=20")[1]
    return bomb, other.finished(neighbour)


def _uid(result: dict[str, Any]) -> str:
    uids: list[str] = [item for item in result["isolation"] if item.startswith("uid:")]
    (uid,) = uids
    return uid
