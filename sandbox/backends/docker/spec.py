"""What a sandbox container is created with: typed settings in, Docker SDK arguments out.

The one place that decides a container's isolation, so a reviewer can read it in one sitting.
Nothing from a request reaches the engine except the typed limits below (no passthrough of raw
`docker run` options). The seccomp profile is ours (`seccomp_profile`), never the engine's
default, which differs between engines. There is no init process: the guest bootstrap is the
container's pid 1 and the script runs in it, so no process of another trust level (docker-init,
which a script could ptrace and stop, or make report another exit code) shares the container.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.backends.base import Capabilities
from sandbox.backends.docker.channel import GUEST_MOUNT
from sandbox.backends.docker.seccomp_profile import profile_json

__all__ = [
    "LABEL_CHANNEL_DIR",
    "LABEL_MANAGED",
    "LABEL_OWNER",
    "ContainerSettings",
    "container_capabilities",
    "container_kwargs",
    "isolation_layers",
]

# Every container and only ours carries LABEL_MANAGED; the janitor finds leftovers by it.
LABEL_MANAGED = "org.ptc-sandbox.managed"
LABEL_OWNER = "org.ptc-sandbox.owner"  # "<host>:<pid>:<process start time>" of the server
LABEL_CHANNEL_DIR = "org.ptc-sandbox.channel-dir"
LABEL_BACKEND = "org.ptc-sandbox.backend"  # the backend's name: one server may run two

CPU_CORES = 1.0
LOG_MAX_BYTES = "1m"


@dataclass(frozen=True)
class ContainerSettings:
    image: str
    name: str
    owner: str
    channel_dir: Path
    memory_bytes: int
    processes: int
    tmp_bytes: int
    user: str = "65532:65532"
    python: str = "python3"
    cpu_cores: float = CPU_CORES
    # The engine's OCI runtime: "runc", or "runsc" (gVisor: a user-space kernel between the
    # script and the host's). Always named, so the result's isolation says which was in force.
    oci_runtime: str = "runc"
    backend: str = "docker"


def container_kwargs(settings: ContainerSettings) -> dict[str, Any]:
    """Keyword arguments for `docker.DockerClient.containers.create`."""
    return {
        "image": settings.image,
        "command": [
            settings.python,
            "-I",
            "-B",
            "-X",
            "utf8",
            "/ptc/bootstrap.py",
            "--connect",
            GUEST_MOUNT,
        ],
        "name": settings.name,
        "hostname": "sandbox",
        "user": settings.user,
        "working_dir": "/tmp",
        "environment": {"HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
        "labels": {
            LABEL_MANAGED: "1",
            LABEL_OWNER: settings.owner,
            LABEL_CHANNEL_DIR: str(settings.channel_dir),
            LABEL_BACKEND: settings.backend,
        },
        # No network at all: not even loopback is shared with anything.
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={settings.tmp_bytes},mode=1777"},
        # /dev/shm is the other writable place; it counts against the memory limit too.
        "shm_size": settings.tmp_bytes,
        "volumes": {str(settings.channel_dir): {"bind": GUEST_MOUNT, "mode": "ro"}},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={profile_json(settings.oci_runtime)}"],
        "ipc_mode": "private",
        # Memory without swap; the engine kills on exhaustion and reports State.OOMKilled.
        "mem_limit": settings.memory_bytes,
        "memswap_limit": settings.memory_bytes,
        "pids_limit": host_pids_limit(settings),
        "nano_cpus": int(settings.cpu_cores * 1e9),
        # No init: the guest is pid 1 (as in the process backend), so nothing else is in reach
        # of the script. Signals it sends itself without a handler are ignored, as for any init;
        # the host's SIGKILL still ends it, and with it every process of the container.
        "init": False,
        # Under runsc, stdin is a pipe nobody writes to, never the engine's /dev/null: runsc
        # hands the container's stdio to its sandbox process, which runs as nobody, by
        # fchown(0..2, 65534, 65534), and an engine's shim gives a container without stdin the
        # host's own /dev/null, so every start re-owned the host's /dev/null to nobody (and
        # moved its ctime). The guest closes fd 0 and opens gVisor's /dev/null before the
        # script runs, so the script sees the same empty stdin either way (SECURITY.md).
        "stdin_open": settings.oci_runtime == "runsc",
        "tty": False,
        "log_config": {"type": "json-file", "config": {"max-size": LOG_MAX_BYTES, "max-file": "1"}},
        "runtime": settings.oci_runtime,
    }


# Under gVisor the container's pids cgroup holds gVisor's kernel, not the script: about 40
# threads of its own at rest, and on the ptrace platform some 8-10 more per guest process (a stub
# process with its threads, each traced by a thread of the kernel); threads of one process cost
# little. Measured with Debian's runsc 20221219: 42-45 at rest, 170-176 with 16 live processes,
# 48-53 with 32 live threads. Go cannot survive a refused thread (gVisor's kernel dies, exit
# code 2), so the host cap is a backstop sized above that, and the script's own count is
# enforced inside gVisor (RLIMIT_NPROC, which its kernel applies to processes and threads alike).
GVISOR_PIDS_AT_REST = 64
GVISOR_PIDS_PER_PROCESS = 12


def host_pids_limit(settings: ContainerSettings) -> int:
    """The container's pids cgroup limit: the script's `processes`, or under gVisor the
    backstop for gVisor's kernel running that many processes."""
    if settings.oci_runtime == "runsc":
        return GVISOR_PIDS_AT_REST + GVISOR_PIDS_PER_PROCESS * settings.processes
    return settings.processes


def isolation_layers(settings: ContainerSettings, cgroup_readable: bool) -> list[str]:
    layers = [
        "container",
        "pidns",
        "netns:none",
        "ipcns",
        "utsns",
        "mntns",
        "caps:none",
        "no_new_privs",
        "seccomp:ptc",
        "init:none",
        "fs:readonly-root",
        f"uid:{settings.user.partition(':')[0]}",
        "cgroup:memory",
        "cgroup:pids",
        "cgroup:cpu",
    ]
    if cgroup_readable:
        layers.append("cgroup:accounting")
    layers.append(f"oci-runtime:{settings.oci_runtime}")
    if settings.oci_runtime == "runsc":
        layers.append("gvisor")
    return [*layers, "rlimits", f"tmpfs:{settings.tmp_bytes}", "stdin:empty"]


def container_capabilities(oci_runtime: str, cgroup_readable: bool) -> Capabilities:
    """A container's, under ``oci_runtime``; ``cgroup_readable``: the host can read its cgroup
    (the engine runs on this host), where its CPU time is the kernel's figure."""
    gvisor = oci_runtime == "runsc"
    return Capabilities(
        cgroup_cpu=cgroup_readable,
        # Under gVisor the pids cgroup counts gVisor's own threads as well (see
        # `host_pids_limit`): gVisor's kernel counts the script's tasks (RLIMIT_NPROC).
        cgroup_pids=not gvisor,
        # The engine's memory cgroup caps the container (under gVisor: the script and gVisor's
        # kernel together, which is stricter).
        cgroup_memory=True,
        # gVisor's kernel kills its pid 1 with a signal the script sent itself, and the host
        # cannot measure gVisor's tmpfs: a SIGXFSZ exit there is uncorroborated.
        own_signals_delivered=gvisor,
        runtimes=True,
    )
