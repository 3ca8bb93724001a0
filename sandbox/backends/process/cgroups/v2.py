"""cgroup v2: one unified tree; every controller's files in the sandbox's one directory."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Literal

from sandbox.backends.process.cgroups.controls import (
    CFS_PERIOD_US,
    CgroupLimits,
    CgroupUsage,
    cfs_quota_us,
)
from sandbox.backends.process.cgroups.files import CgroupError, int_or_zero, keyed, read, write

__all__ = ["REQUIRED", "V2Controls", "enable_controllers"]

REQUIRED = ("memory", "pids", "cpu")


class V2Controls:
    """The v2 files of one sandbox cgroup."""

    version: Literal[1, 2] = 2

    def __init__(self, dirs: dict[str, str]) -> None:
        self._dir = dirs["memory"]  # every controller is the same directory on v2

    def set_limits(self, limits: CgroupLimits) -> None:
        d = self._dir
        write(f"{d}/memory.max", str(limits.memory_bytes))
        if os.path.exists(f"{d}/memory.swap.max"):
            write(f"{d}/memory.swap.max", "0")
        write(f"{d}/pids.max", str(limits.pids))
        if limits.cpu_cores is None:
            write(f"{d}/cpu.max", f"max {CFS_PERIOD_US}")
        else:
            write(f"{d}/cpu.max", f"{cfs_quota_us(limits.cpu_cores)} {CFS_PERIOD_US}")

    def usage(self) -> CgroupUsage:
        d = self._dir
        events = keyed(f"{d}/memory.events")
        refused = keyed(f"{d}/pids.events").get("max", 0)
        return CgroupUsage(
            cpu_time_ns=keyed(f"{d}/cpu.stat").get("usage_usec", 0) * 1000,
            memory_peak_bytes=int_or_zero(f"{d}/memory.peak"),
            oom_killed=events.get("oom_kill", 0) > 0,
            pids_limit_hit=refused > 0,
            memory_limit_hits=events.get("max", 0),
            pids_limit_hits=refused,
            peak_pids=int_or_zero(f"{d}/pids.peak") if os.path.exists(f"{d}/pids.peak") else None,
        )

    def kill_file(self) -> Path | None:
        kill = Path(self._dir, "cgroup.kill")
        return kill if kill.exists() else None

    def freeze(self) -> bool:
        state = f"{self._dir}/cgroup.freeze"
        if not os.path.exists(state):
            return False
        write(state, "1")
        return True

    def frozen(self) -> bool:
        return "frozen 1" in read(f"{self._dir}/cgroup.events").splitlines()

    def thaw(self) -> None:
        write(f"{self._dir}/cgroup.freeze", "0")


def enable_controllers(directory: Path) -> None:
    """Hands the required controllers to ``directory``'s children (``subtree_control``)."""
    enabled = set(read(directory / "cgroup.subtree_control").split())
    missing = [c for c in REQUIRED if c not in enabled]
    if not missing:
        return
    try:
        write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
    except CgroupError as exc:
        if exc.errno != errno.EBUSY:
            raise
        # v2's no-internal-process rule: a cgroup that holds processes (ours, here) cannot
        # hand controllers to children. The operator must start the server in a leaf of a
        # delegated subtree (systemd Delegate=yes, or move PID 1 of a container to a child).
        raise CgroupError(
            errno.EBUSY,
            f"{exc.strerror}: {directory} holds processes, so v2 cannot delegate"
            f" {', '.join(missing)} to its children; run the server in a delegated subtree",
        ) from exc
