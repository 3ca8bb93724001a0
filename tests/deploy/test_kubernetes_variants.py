"""Every shipped variant of the Kubernetes base, run: the server image (top-level Dockerfile,
`scripts/build_images.sh --server`) started on the test engine with exactly the container
settings the rendered Deployment gives (`k8s_variants.docker_settings`: user, capabilities,
privileged, seccomp and AppArmor profiles, unmasked /proc, read-only root, the memory limit as
the container's cgroup limit, the CPU request as its shares, the emptyDirs), its arguments with
`$(VAR)` expanded from its environment as the kubelet does, the ConfigMap's server.toml and the
example tenant of the tenants Secret mounted where the volumes put them. The cgroup filesystem
is left as the engine mounts it: read-only for a container that is not privileged (this engine
is cgroup v1, where that is Docker's and the node runtimes' behaviour alike), read-write for a
privileged one.

Each variant must become ready within its probes' budget (the startup probe's for the whole
server, then the readiness probe's), and a memory bomb must end as the variant says: an OOM kill
seen by the kernel where each sandbox has its own cgroup (overlays/privileged), a MemoryError
under RLIMIT_AS reported with guest evidence where it has not (the base, degraded). The server
is healthy and serving after the bomb, and the container was never OOM-killed.

What Docker cannot reproduce: `hostUsers: false` (a pod user namespace; Docker has none per
container), so the base's container runs in the node's user namespace, with more privilege than
its pod would have, never less. The audit store is the SQLite fallback on the state emptyDir
(`--network none`: no PostgreSQL), as the Secret is replaced by an operator anyway.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.backends.test_uid_per_sandbox import HOLDING_BOMB
from tests.backends.test_uid_per_sandbox import NEIGHBOUR as UID_NEIGHBOUR
from tests.backends.test_uid_per_sandbox import NEIGHBOUR_OUT as UID_NEIGHBOUR_OUT
from tests.deploy.k8s_pod import Pod
from tests.deploy.k8s_variants import (
    SERVER_RESERVE_BYTES,
    VARIANTS,
    pod_spec,
    probe_budget_s,
    quantity_bytes,
)
from tests.deploy.variants_table import Outcomes, violation_text
from tests.server_image import docker, logs

pytestmark = [pytest.mark.requires_docker, pytest.mark.timeout(300)]


# Allocates and touches 16 MiB at a time until something stops it.
MEMORY_BOMB = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 * 1024 * 1024))\n"


# variant -> (exit code of `ptc run`, status, the memory violation's action and evidence,
# whether the kernel's peak figure is there, the isolation layers that tell the variants apart)
EXPECTED = {
    "base": (3, "limit_exceeded", "refused", "guest", False, "rlimits"),
    "privileged": (3, "limit_exceeded", "killed", "kernel", True, "cgroup:memory"),
}


@pytest.mark.parametrize("pod", list(VARIANTS), indirect=True)
def test_the_variant_becomes_ready_and_reports_a_memory_bomb_as_it_says(pod: Pod) -> None:
    variant = next(v for v in VARIANTS if pod.name.startswith(f"ptc-k8s-{v}-"))
    code, status, action, evidence, peak, layer = EXPECTED[variant]
    started = pod.start()
    serving = pod.wait_serving(False, started + probe_budget_s(pod.spec["startupProbe"]))
    pod.wait_serving(True, serving + probe_budget_s(pod.spec["readinessProbe"]))
    assert "not serving executions" not in logs(pod.name)

    # The server beside its warm pool fits the reserve the manifests' arithmetic keeps for it
    # (with room for the memory-backed /tmp, which counts against the pod's limit as well).
    (tmp,) = [v for v in pod_spec(pod.documents)["volumes"] if v["name"] == "tmp"]
    working_set = pod.working_set_bytes()
    print(f"{variant}: ready after {serving - started:.1f} s, working set {working_set >> 20} MiB")
    outcomes = Outcomes(variant)
    outcomes.saw("ready", f"after {serving - started:.1f} s", figure=True)
    assert working_set + quantity_bytes(tmp["emptyDir"]["sizeLimit"]) < SERVER_RESERVE_BYTES

    returncode, result = pod.run(MEMORY_BOMB)
    assert (returncode, result["status"]) == (code, status), result
    (violation,) = result["violations"]
    assert (violation["limit"], violation["action"], violation["evidence"]) == (
        "memory",
        action,
        evidence,
    ), violation
    assert violation["limit_value"] == 256 * 1024**2  # the tenant's ceiling, its default here
    assert (violation["observed"] is not None) is peak, violation
    assert layer in result["isolation"], result["isolation"]
    outcomes.saw("memory_bomb", violation_text(result))
    listed = [item for item in result["isolation"] if not item.startswith("uid:")]
    outcomes.saw("isolation", ", ".join(f"`{item}`" for item in listed))
    if variant == "base":
        assert result["error"]["type"] == "MemoryError", result
        assert not any(item.startswith("cgroup:") for item in result["isolation"])
    else:
        assert "cgroup:pids" in result["isolation"]

    # The server outlived the bomb: still ready, still running scripts, never OOM-killed.
    assert pod.health(True) == "SERVING"
    # Sandbox processes are the OOM killer's first choice in the pod, the server (pid 1) not.
    returncode, result = pod.run("print(6 * 7, open('/proc/self/oom_score_adj').read())")
    assert (returncode, result["status"], result["stdout"]) == (0, "ok", "42 1000\n\n"), result
    assert docker("exec", pod.name, "cat", "/proc/1/oom_score_adj").stdout == "0\n"
    assert (pod.state("Running"), pod.state("OOMKilled")) == ("true", "false")


@pytest.mark.parametrize("pod", ["base without --allow-degraded"], indirect=True)
def test_without_allow_degraded_the_base_never_becomes_ready(pod: Pod) -> None:
    """The negative control, and the bug the base had: in a container that is not privileged
    the cgroup filesystem is read-only, and without `--allow-degraded` the process backend
    refuses to start, so the startup probe never passes and the pod never becomes Ready."""
    started = pod.start()
    deadline = started + probe_budget_s(pod.spec["startupProbe"])
    while "process backend refuses" not in logs(pod.name):
        assert pod.state("Running") == "true", logs(pod.name)
        assert time.monotonic() < deadline, logs(pod.name)
        time.sleep(0.5)
    assert (
        "ptc serve: not serving executions: process backend refuses to run without cgroup limits"
        " (cgroup v1 cpu at /sys/fs/cgroup/cpu is mounted read-only;"
    ) in logs(pod.name)
    assert (pod.health(False), pod.health(True)) == ("NOT_SERVING", "NOT_SERVING")


# Whole-sandbox scripts, run in the base's container: 8 threads and 4 subprocesses;
# N processes each touching MIB MiB; N processes burning CPU; a neighbour printing meanwhile.
THREADS_AND_SUBPROCESSES = """
import subprocess, sys, threading
go = threading.Event()
threads = [threading.Thread(target=go.wait) for _ in range(8)]
for t in threads:
    t.start()
children = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(4)]
go.set()
for t in threads:
    t.join()
print(len(threads), [c.wait() for c in children])
"""
HOLDERS = """
import os, time
kids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(200 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(10)
        os._exit(0)
    kids.append(pid)
block = bytearray(200 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1
for pid in kids:
    os.waitpid(pid, 0)
print("held")
"""
BURNERS = """
import os, time
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print("burnt")
"""
NEIGHBOUR = "import time\nfor i in range(8):\n    time.sleep(0.25)\n    print(i)"
NEIGHBOUR_OUT = "".join(f"{i}\n" for i in range(8))
# Sampling period and tick: what the host's CPU sum may pass its limit by (docs/limits.md).
CPU_SLACK_S = 0.5


def _fork_bomb_beside_threads(pod: Pod) -> None:
    """One uid per sandbox (the server is root in the container): one execution's fork bomb
    (processes 64) holds its processes while another's 8 threads and 4 subprocesses run; the
    other ends untouched, the bomb at its own 63 forks with its `processes` violation."""
    neighbour = pod.started(UID_NEIGHBOUR)
    bomb = pod.run(HOLDING_BOMB, "processes=64", "wall_time=20")[1]
    other = pod.finished(neighbour)
    assert (other["status"], other["stdout"], other["violations"]) == ("ok", UID_NEIGHBOUR_OUT, [])
    assert bomb["status"] == "limit_exceeded", bomb
    assert [v["limit"] for v in bomb["violations"]] == ["processes"], bomb
    assert bomb["stdout"] == "63\n", bomb
    uids = [next(i for i in r["isolation"] if i.startswith("uid:")) for r in (bomb, other)]
    assert uids[0] != uids[1], uids
    print(f"base: a fork bomb beside threads, uids {uids}: the neighbour ok")
    outcomes = Outcomes("base")
    outcomes.saw("bomb", violation_text(bomb))
    outcomes.saw("bomb_forks", int(bomb["stdout"]))
    outcomes.saw("bomb_neighbour", violation_text(other))
    outcomes.saw("bomb_uids", " and ".join(u.removeprefix("uid:") for u in uids), figure=True)


def _beside_a_neighbour(pod: Pod, script: str, *limits: str) -> dict[str, Any]:
    """Runs ``script`` while another execution prints; the other must end untouched."""
    neighbour = pod.started(NEIGHBOUR)
    result = pod.run(script, *limits)[1]
    other = pod.finished(neighbour)
    assert (other["status"], other["stdout"], other["violations"]) == ("ok", NEIGHBOUR_OUT, [])
    return result


@pytest.mark.parametrize("pod", ["base"], indirect=True)
def test_in_the_degraded_base_threads_memory_and_cpu_hold_for_the_whole_sandbox(
    pod: Pod,
) -> None:
    """The degraded base without a cgroup per sandbox: threads are not memory under
    RLIMIT_AS, and the host's sums over each sandbox's processes hold memory and CPU time for
    the sandbox as a whole, evidence `host`; a sandbox running beside the one stopped is
    untouched, the server stays ready and is never OOM-killed."""
    started = pod.start()
    serving = pod.wait_serving(False, started + probe_budget_s(pod.spec["startupProbe"]))
    pod.wait_serving(True, serving + probe_budget_s(pod.spec["readinessProbe"]))

    returncode, result = pod.run(THREADS_AND_SUBPROCESSES)
    assert (returncode, result["status"], result["stdout"]) == (0, "ok", "8 [0, 0, 0, 0]\n"), result
    outcomes = Outcomes("base")
    outcomes.saw("threads", violation_text(result))
    mechanisms = [item for item in result["isolation"] if item.startswith("limit:")]
    assert mechanisms == [
        "limit:memory=host+rlimit",
        "limit:cpu_time=host+rlimit",
        "limit:processes=rlimit",
    ]
    print(f"base: isolation {result['isolation']}")

    result = _beside_a_neighbour(pod, HOLDERS, "wall_time=60")
    assert (result["status"], result["stdout"]) == ("limit_exceeded", ""), result
    (violation,) = result["violations"]
    assert (violation["limit"], violation["action"], violation["evidence"]) == (
        "memory",
        "killed",
        "host",
    )
    assert violation["limit_value"] == 256 * 1024**2
    assert 256 * 1024**2 < violation["observed"] < 4 * 256 * 1024**2
    print(f"base: 4 x 200 MiB stopped at {int(violation['observed']) >> 20} MiB")
    outcomes.saw("holders", violation_text(result))
    outcomes.saw("holders_mib", int(violation["observed"]) >> 20, figure=True)

    before = time.monotonic()
    result = _beside_a_neighbour(pod, BURNERS, "cpu_time=1", "wall_time=60")
    assert result["status"] == "limit_exceeded", result
    (violation,) = result["violations"]
    assert (violation["limit"], violation["action"], violation["evidence"]) == (
        "cpu_time",
        "killed",
        "host",
    )
    assert 1 <= violation["observed"] < 1 + CPU_SLACK_S, violation
    assert time.monotonic() - before < 10
    print(f"base: 4 CPU burners stopped at {violation['observed']} s of CPU")
    outcomes.saw("burners", violation_text(result))
    outcomes.saw("burners_s", violation["observed"], figure=True)

    _fork_bomb_beside_threads(pod)

    assert pod.health(True) == "SERVING"
    returncode, result = pod.run("print(6 * 7)\n")
    assert (returncode, result["stdout"]) == (0, "42\n"), result
    restarts = docker("inspect", "-f", "{{.RestartCount}}", pod.name).stdout.strip()
    assert (pod.state("Running"), pod.state("OOMKilled"), restarts) == ("true", "false", "0")
