"""What a process sandbox can enforce and observe, and how each result says so.

Its `Capabilities` (read by the evidence rules to decide whose word a refusal or a death is) and
the `isolation` entries that name the mechanism of each whole-sandbox limit, both decided by
whether the sandbox has a cgroup of its own and, without one, whether the host sums its
processes (`host_meter`).
"""

from __future__ import annotations

import os

from sandbox.backends.base import Capabilities
from sandbox.backends.process.bwrap import NAMESPACE_LAYERS

__all__ = ["limit_mechanisms", "process_capabilities", "sandbox_isolation"]


def process_capabilities(cgroup: bool, host_accounting: bool = True) -> Capabilities:
    """A process sandbox's: its own cgroup, where the host has cgroups, counts and caps it all;
    without one the host sums its processes (unless turned off); Linux drops the signals an init
    sends itself, so a SIGXFSZ death there is the kernel's."""
    return Capabilities(
        cgroup_cpu=cgroup,
        cgroup_pids=cgroup,
        cgroup_memory=cgroup,
        host_accounting=host_accounting and not cgroup,
        own_signals_delivered=False,
        runtimes=True,
    )


def sandbox_isolation(
    sandbox_uid: int | None,
    zygote_uid: int,
    seccomp: bool,
    host_accounting: bool,
    tmp_bytes: int,
    cgroup_layers: list[str] | None,
) -> list[str]:
    """What isolates one sandbox and what enforces each of its limits, as its result lists them:
    its uid is its own (``sandbox_uid``, `uid_range`) or the zygote's, which is the host's own
    where the server is not root; ``cgroup_layers`` None: it has no cgroup."""
    uid = sandbox_uid
    if uid is None:
        uid = zygote_uid if os.getuid() == 0 else os.getuid()
    isolation = [*NAMESPACE_LAYERS, f"uid:{uid}"]
    if seccomp:
        isolation.append("seccomp")
    if cgroup_layers is not None:
        isolation += cgroup_layers
    elif host_accounting:
        isolation.append("host:accounting")
    isolation += ["rlimits", f"tmpfs:{tmp_bytes}"]
    cgroup = cgroup_layers is not None
    return isolation + limit_mechanisms(cgroup, host_accounting, sandbox_uid is not None)


def limit_mechanisms(cgroup: bool, host_accounting: bool, own_uid: bool = True) -> list[str]:
    """The `isolation` entries that name what enforces each whole-sandbox limit, so that a
    client can refuse a result whose limits it does not accept: ``limit:NAME=MECHANISM``, the
    mechanisms joined with ``+`` in the order they act (a cgroup; the host's sums over the
    sandbox's processes, sampled; an rlimit, per process).

    The processes limit without a cgroup is RLIMIT_NPROC, which the kernel counts per uid: with
    a uid of the sandbox's own (``own_uid``, `uid_range`) it counts that sandbox alone
    (``rlimit``); where every sandbox shares one uid it counts all of them together, and one
    sandbox's processes can use up another's (``rlimit-shared``)."""
    if cgroup:
        memory = cpu = processes = "cgroup"
        cpu = "cgroup+rlimit"  # RLIMIT_CPU a second looser, as a backstop
    elif host_accounting:
        memory = cpu = "host+rlimit"
        processes = "rlimit"
    else:
        memory = cpu = processes = "rlimit"
    if not cgroup and not own_uid:
        processes = "rlimit-shared"
    return [f"limit:memory={memory}", f"limit:cpu_time={cpu}", f"limit:processes={processes}"]
