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

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.backends.test_uid_per_sandbox import HOLDING_BOMB
from tests.backends.test_uid_per_sandbox import NEIGHBOUR as UID_NEIGHBOUR
from tests.backends.test_uid_per_sandbox import NEIGHBOUR_OUT as UID_NEIGHBOUR_OUT
from tests.deploy.k8s_variants import (
    SERVER_RESERVE_BYTES,
    VARIANTS,
    container,
    docker_settings,
    example_tenants,
    pod_spec,
    probe_budget_s,
    quantity_bytes,
    rendered,
    server_toml,
)
from tests.deploy.variants_table import Outcomes, violation_text
from tests.server_image import DOCKER, IMAGE, docker, logs, require_image

pytestmark = [pytest.mark.requires_docker, pytest.mark.timeout(300)]

ADDRESS = "127.0.0.1:50051"  # the container's own loopback: --listen=0.0.0.0:50051
# Allocates and touches 16 MiB at a time until something stops it.
MEMORY_BOMB = "chunks = []\nwhile True:\n    chunks.append(b'x' * (16 * 1024 * 1024))\n"


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a container argument."""
    for name, value in env.items():
        arg = arg.replace(f"$({name})", value)
    assert "$(" not in arg, f"{arg}: a variable the container's env does not define"
    return arg


def _pem() -> str:
    key = Ed25519PrivateKey.generate()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode("ascii")


class Pod:
    """One variant's container, started as the manifest gives it."""

    def __init__(self, variant: str, workdir: Path, without: tuple[str, ...] = ()) -> None:
        self.documents = rendered(variant)
        self.spec = container(self.documents)
        self.name = f"ptc-k8s-{variant}-{uuid.uuid4().hex[:10]}"
        settings = docker_settings(self.documents)
        tenants, self.key = example_tenants(self.documents)
        mounts: list[str] = []
        for path, (kind, detail) in settings.volumes.items():
            if kind == "configMap":
                assert (path, detail) == ("/etc/ptc/server.toml", "server.toml")
                source = workdir / "server.toml"
                source.write_text(server_toml(self.documents))
                mounts += ["--volume", f"{source}:{path}:ro"]
            elif kind == "secret":
                assert (path, detail) == ("/etc/ptc/tenants", "ptc-tenants")
                directory = workdir / "tenants"
                directory.mkdir()
                (directory / "tenants.toml").write_text(tenants)
                (directory / "tenants.toml").chmod(0o400)  # the volume's defaultMode
                mounts += ["--volume", f"{directory}:{path}:ro"]
        # The env the kubelet gives the container: its fieldRef and the replaced Secrets.
        values = {
            "POD_NAME": self.name,
            "POD_IP": "127.0.0.1",  # --network none: loopback is its only address
            "PTC_AUDIT_DB": "/var/lib/ptc/audit.db",
            "PTC_CHECKPOINT_KEY": _pem(),
        }
        assert {e["name"] for e in self.spec["env"]} == set(values)
        env = [item for name, value in values.items() for item in ("--env", f"{name}={value}")]
        args = [_expand(arg, values) for arg in self.spec["args"] if arg not in without]
        assert len(args) == len(self.spec["args"]) - len(without)
        assert "command" not in self.spec  # args go to the image's entrypoint, as here
        self.options = settings.options
        for note in settings.notes:
            print(f"{variant}: {note}")
        self.command = [
            "run", "-d", "--name", self.name, "--network", "none",
            *settings.options, *mounts, *env, IMAGE, *args,
        ]  # fmt: skip

    def start(self) -> float:
        started = docker(*self.command)
        assert started.returncode == 0, started.stderr
        return time.monotonic()

    def state(self, field: str) -> str:
        return docker("inspect", "-f", f"{{{{.State.{field}}}}}", self.name).stdout.strip()

    def health(self, ready: bool) -> str:
        args = ["ptc", "health", "--server", ADDRESS, "--timeout", "3"]
        found = docker("exec", self.name, *args, *(["--ready"] if ready else []))
        return found.stdout.strip() or found.stderr.strip()

    def wait_serving(self, ready: bool, deadline: float) -> float:
        """Polls the health service as the probe does until SERVING; the time it answered."""
        while True:
            assert self.state("Running") == "true", logs(self.name)
            if self.health(ready) == "SERVING":
                return time.monotonic()
            assert time.monotonic() < deadline, (
                f"not {'ready' if ready else 'serving'} within the probe's budget:\n"
                + logs(self.name)
            )
            time.sleep(0.5)

    def run(self, script: str, *limits: str) -> tuple[int, dict[str, Any]]:
        found = self.start_run(script, *limits)
        out, err = found.communicate(script, timeout=120)
        assert out, err + logs(self.name)
        result: dict[str, Any] = json.loads(out)
        return found.returncode, result

    def start_run(self, script: str, *limits: str) -> subprocess.Popen[str]:
        """`ptc run` in the container, started (several run side by side); the caller passes
        ``script`` to ``communicate``."""
        flags = [item for limit in limits for item in ("--limit", limit)]
        return subprocess.Popen(
            [DOCKER, "exec", "-i", "--env", f"PTC_API_KEY={self.key}", self.name,
             "ptc", "run", "--server", ADDRESS, "--json", *flags, "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def memory_cgroup(self) -> Path:
        """The container's memory cgroup on this (v1) engine's host: the pod's, as the kernel
        counts it."""
        full = docker("inspect", "-f", "{{.Id}}", self.name).stdout.strip()
        (directory,) = Path("/sys/fs/cgroup/memory").glob(f"**/{full}")
        return directory

    def working_set_bytes(self) -> int:
        """The container's memory as the kubelet counts it: usage minus inactive file pages."""
        directory = self.memory_cgroup()
        usage = int((directory / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
        return usage - int(stat["total_inactive_file"])

    def oom_kills(self) -> int:
        """The OOM kills the kernel counted in the container's (the pod's) memory cgroup."""
        control = (self.memory_cgroup() / "memory.oom_control").read_text()
        return int(control.split("oom_kill ")[1].split()[0])


@pytest.fixture
def pod(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pod]:
    require_image()
    variant, *without = request.param.split(" without ")
    made = Pod(variant, tmp_path, tuple(without))
    try:
        yield made
        # As the kubelet ends a pod: SIGTERM, then its grace period. The server drains, removes
        # its sandboxes' cgroups and exits 0.
        grace = pod_spec(made.documents)["terminationGracePeriodSeconds"]
        stopped = docker("stop", "--time", str(grace), made.name, timeout=grace + 30)
        assert stopped.returncode == 0, stopped.stderr
        assert made.state("ExitCode") == "0", logs(made.name)
    finally:
        docker("rm", "-f", "--volumes", made.name)
    assert made.name not in docker("ps", "-a", "--format", "{{.Names}}").stdout.split()


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
    neighbour = pod.start_run(UID_NEIGHBOUR)
    assert neighbour.stdin is not None
    neighbour.stdin.write(UID_NEIGHBOUR)
    neighbour.stdin.close()
    bomb = pod.run(HOLDING_BOMB, "processes=64", "wall_time=20")[1]
    assert neighbour.stdout is not None and neighbour.stderr is not None
    with neighbour:
        out = neighbour.stdout.read()
        neighbour.stderr.read()
    other = json.loads(out)
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
    neighbour = pod.start_run(NEIGHBOUR)
    assert neighbour.stdin is not None
    neighbour.stdin.write(NEIGHBOUR)
    neighbour.stdin.close()  # the script is read whole: it runs from here on
    result = pod.run(script, *limits)[1]
    assert neighbour.stdout is not None and neighbour.stderr is not None
    with neighbour:
        out = neighbour.stdout.read()
        neighbour.stderr.read()
    other = json.loads(out)
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
    started = [pod.start_run(script) for _ in range(GROWERS)]
    for one in started:
        assert one.stdin is not None
        one.stdin.write(script)
        one.stdin.close()
    results = []
    for one in started:
        assert one.stdout is not None and one.stderr is not None
        with one:
            out = one.stdout.read()
            err = one.stderr.read()
        assert out, err + logs(pod.name)
        results.append(json.loads(out))
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
    stays ready.

    The server sizes `max_sandboxes` at start so that this cannot happen (12 x 256 MiB + 1 GiB
    in 4 GiB, `sandbox.server.memory_budget`). So the pod's limit is lowered after the server
    is ready, as Kubernetes' in-place resize of a running pod does (the kubelet updates the
    container's cgroup, here `docker update`): the way an operator overcommits a pod past the
    server's arithmetic."""
    started = pod.start()
    serving = pod.wait_serving(False, started + probe_budget_s(pod.spec["startupProbe"]))
    pod.wait_serving(True, serving + probe_budget_s(pod.spec["readinessProbe"]))
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
