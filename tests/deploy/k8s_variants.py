"""The shipped variants of the Kubernetes base, rendered, and what the tests read from them: the
Deployment's container, its `server.toml`, the example tenant of the tenants Secret made real
with a key, the memory arithmetic, and the container's settings translated into `docker run`
options (what a container runtime would give the pod's container on a node).

The translation covers exactly the fields the manifests use and refuses any other, so a field
added to a manifest that the Docker test could not reproduce fails the test instead of being
left out silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.tenants.keys import new_key, sha256_of
from tests.deploy.kustomize_subset import render

__all__ = [
    "SERVER_RESERVE_BYTES",
    "VARIANTS",
    "DockerSettings",
    "container",
    "docker_settings",
    "example_tenants",
    "pod_spec",
    "probe_budget_s",
    "quantity_bytes",
    "rendered",
    "server_toml",
]

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes"
# Every shipped variant: the base (degraded) and each overlay (README.md "Variants").
VARIANTS = {"base": BASE, "privileged": BASE / "overlays" / "privileged"}
# What the pod's memory limit keeps for the server beside its sandboxes (the manifests'
# arithmetic): the server, its fork server and warm pool (measured in test_kubernetes_variants),
# and the memory-backed /tmp emptyDir, whose pages count against the pod's limit.
SERVER_RESERVE_BYTES = 1024**3

_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "": 1}


def rendered(variant: str) -> list[dict[str, Any]]:
    return render(VARIANTS[variant])


def _one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_spec(documents: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(documents, "Deployment", "ptc-server")["spec"]["template"]["spec"]
    return spec


def container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = pod_spec(documents)["containers"]
    return dict(found)


def server_toml(documents: list[dict[str, Any]]) -> str:
    text: str = _one(documents, "ConfigMap", "ptc-server-config")["data"]["server.toml"]
    return text


def example_tenants(documents: list[dict[str, Any]]) -> tuple[str, str]:
    """The example tenant the tenants Secret shows (commented out), uncommented, with a fresh
    API key in place of its placeholder hash: (tenants.toml, the key)."""
    text: str = _one(documents, "Secret", "ptc-tenants")["stringData"]["tenants.toml"]
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("e.g.:")) + 1
    block: list[str] = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    key = new_key()
    toml = "\n".join(block).replace("sha256:...", sha256_of(key)) + "\n"
    return toml, key


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity in the binary units the manifests use (``4Gi``, ``256Mi``)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|)", quantity)
    if match is None:
        raise ValueError(f"memory quantity {quantity!r}: use a binary unit (Ki, Mi, Gi, Ti)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def probe_budget_s(probe: dict[str, Any]) -> int:
    """How long a probe may fail before Kubernetes acts: its initial delay plus its failure
    threshold times its period (the Kubernetes defaults where a field is unset)."""
    initial: int = probe.get("initialDelaySeconds", 0)
    period: int = probe.get("periodSeconds", 10)
    failures: int = probe.get("failureThreshold", 3)
    return initial + failures * period


@dataclass(frozen=True)
class DockerSettings:
    """`docker run` options for the pod's container, and what the test must supply itself."""

    options: list[str]
    # emptyDir and ConfigMap/Secret volumes: mount path -> (kind, detail)
    volumes: dict[str, tuple[str, str]]
    # Where this engine could not take a setting as it is and took its parts instead.
    notes: list[str]


# Linux capabilities by number (linux/capability.h), for naming the ones a host withholds.
_CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]


def withheld_capabilities() -> list[str]:
    """Capabilities missing from this host's bounding set, which the engine (on this host, under
    the same set) cannot give any container: `--privileged` then fails ("unable to apply
    caps"), as it does on a machine that itself runs confined."""
    status = Path("/proc/self/status").read_text(encoding="ascii")
    (line,) = [line for line in status.splitlines() if line.startswith("CapBnd:")]
    bounding = int(line.split()[1], 16)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text(encoding="ascii"))
    return [
        _CAPABILITIES[n] for n in range(min(last + 1, len(_CAPABILITIES))) if not bounding >> n & 1
    ]


def _privileged(notes: list[str]) -> list[str]:
    withheld = withheld_capabilities()
    if not withheld:
        return ["--privileged"]
    # What `privileged: true` gives the server, taken apart: every capability the host has, no
    # seccomp or AppArmor profile, an unmasked /proc, and a read-write cgroup filesystem (the
    # host's hierarchy in the host's cgroup namespace, where /proc/self/cgroup names the
    # container's own cgroup). Host devices, which the server does not use, are left out.
    notes.append(
        "privileged: true taken apart: this host withholds "
        + ", ".join(withheld)
        + " from every container, so the engine refuses --privileged"
    )
    return [
        "--cap-add", "ALL", *(item for cap in withheld for item in ("--cap-drop", cap)),
        "--security-opt", "seccomp=unconfined",
        "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined",
        "--cgroupns", "host", "--volume", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    ]  # fmt: skip


_CONTEXT_FIELDS = {
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "privileged",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
    "seccompProfile",
    "appArmorProfile",
    "procMount",
}


def docker_settings(documents: list[dict[str, Any]]) -> DockerSettings:
    """The container settings of the Deployment as `docker run` options, field by field.

    What Docker cannot reproduce is said here rather than approximated: `hostUsers: false`
    (a pod user namespace) has no per-container equivalent in Docker, so the container runs in
    the node's user namespace, which gives it more privilege than the pod, never less; the
    ephemeral-storage limit is the kubelet's eviction, not a container setting.
    """
    pod = pod_spec(documents)
    spec = container(documents)
    context = spec["securityContext"]
    unknown = set(context) - _CONTEXT_FIELDS
    if unknown:
        raise ValueError(f"securityContext fields the translation lacks: {sorted(unknown)}")
    options: list[str] = []
    notes: list[str] = []
    options += ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
    if context.get("privileged", False):
        options += _privileged(notes)
    caps = context.get("capabilities", {})
    for cap in caps.get("drop", []):
        options += ["--cap-drop", cap]
    for cap in caps.get("add", []):
        options += ["--cap-add", cap]
    if context.get("allowPrivilegeEscalation", True) is False:
        options += ["--security-opt", "no-new-privileges"]
    if context.get("readOnlyRootFilesystem", False):
        options.append("--read-only")
    seccomp = context.get("seccompProfile", {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        options += ["--security-opt", "seccomp=unconfined"]
    elif seccomp != "RuntimeDefault":
        raise ValueError(f"seccompProfile {seccomp!r}: no translation")
    apparmor = context.get("appArmorProfile", {}).get("type", "RuntimeDefault")
    if apparmor == "Unconfined":
        options += ["--security-opt", "apparmor=unconfined"]
    elif apparmor != "RuntimeDefault":
        raise ValueError(f"appArmorProfile {apparmor!r}: no translation")
    if context.get("procMount", "Default") == "Unmasked":
        options += ["--security-opt", "systempaths=unconfined"]
    # The cgroup filesystem is left as the engine mounts it, as a node's runtime does: read-only
    # for a container that is not privileged, read-write for a privileged one.
    resources = spec["resources"]
    limits = resources.get("limits", {})
    if set(limits) - {"memory", "ephemeral-storage"}:
        raise ValueError(f"resource limits the translation lacks: {sorted(limits)}")
    memory = quantity_bytes(limits["memory"])
    # Kubernetes runs containers without swap: memory and memory+swap are the same limit.
    options += ["--memory", str(memory), "--memory-swap", str(memory)]
    cpu_request = resources.get("requests", {}).get("cpu")
    if cpu_request is not None:
        # The kubelet gives a container cpu.shares of 1024 per requested core.
        options += ["--cpu-shares", str(int(float(cpu_request) * 1024))]
    volumes: dict[str, tuple[str, str]] = {}
    by_name = {v["name"]: v for v in pod["volumes"]}
    for mount in spec["volumeMounts"]:
        volume = by_name[mount["name"]]
        if "emptyDir" in volume:
            empty = volume["emptyDir"]
            if empty.get("medium") == "Memory":
                size = quantity_bytes(empty["sizeLimit"])
                options += ["--tmpfs", f"{mount['mountPath']}:rw,size={size}"]
                volumes[mount["mountPath"]] = ("tmpfs", str(size))
            else:
                # A disk-backed emptyDir: an anonymous volume, removed with the container.
                options += ["--mount", f"type=volume,destination={mount['mountPath']}"]
                volumes[mount["mountPath"]] = ("volume", "")
        elif "configMap" in volume:
            volumes[mount["mountPath"]] = ("configMap", mount.get("subPath", ""))
        elif "secret" in volume:
            volumes[mount["mountPath"]] = ("secret", volume["secret"]["secretName"])
        else:
            raise ValueError(f"volume {volume['name']!r}: no translation")
    return DockerSettings(options, volumes, notes)
