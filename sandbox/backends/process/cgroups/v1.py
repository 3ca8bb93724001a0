"""cgroup v1: one hierarchy per controller (some co-mounted), so a directory per controller."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from sandbox.backends.process.cgroups.controls import (
    CFS_PERIOD_US,
    CgroupLimits,
    CgroupUsage,
    cfs_quota_us,
)
from sandbox.backends.process.cgroups.files import int_or_zero, keyed, read, write

__all__ = ["REQUIRED", "V1Controls"]

REQUIRED = ("memory", "pids", "cpu", "cpuacct")

# What the kernel gives every new cgroup: no memory limit (PAGE_COUNTER_MAX pages, shown as a
# huge byte count) and a CFS period of 100 ms, whatever its parent has.
_NEW_CGROUP_MEMORY_LIMIT = 1 << 63
_NEW_CGROUP_CFS_PERIOD_US = 100_000


class V1Controls:
    """The v1 files of one sandbox cgroup; remembers what it wrote, for the memsw order."""

    version: Literal[1, 2] = 1

    def __init__(self, dirs: dict[str, str], *, new: bool = False) -> None:
        """``new``: the directories were just made, so they hold the kernel's defaults, which
        spares a start reading the memory limit and writing the period (two file opens)."""
        self._dirs = dirs  # controller ("memory", "pids", "cpu", "cpuacct", "freezer") → dir
        # As we last wrote it (or as the kernel made it); None: unknown, read it.
        self._memory_limit: int | None = _NEW_CGROUP_MEMORY_LIMIT if new else None
        self._memsw: bool | None = None  # swap accounting, looked up once
        self._period_set = new and CFS_PERIOD_US == _NEW_CGROUP_CFS_PERIOD_US

    def set_limits(self, limits: CgroupLimits) -> None:
        mem = self._dirs["memory"]
        limit, memsw = f"{mem}/memory.limit_in_bytes", f"{mem}/memory.memsw.limit_in_bytes"
        value = str(limits.memory_bytes)
        if self._has_memsw():
            # The kernel keeps memsw >= memory at every step, so the order depends on direction
            # (a new cgroup's limit is unlimited: lowering it).
            current = self._memory_limit
            if current is None:
                current = int(read(limit).strip())
            if limits.memory_bytes <= current:
                write(limit, value)
                write(memsw, value)
            else:
                write(memsw, value)
                write(limit, value)
        else:
            # Without swap accounting, swappiness 0 is what keeps a v1 memcg out of swap.
            write(limit, value)
            write(f"{mem}/memory.swappiness", "0")
        self._memory_limit = limits.memory_bytes
        write(f"{self._dirs['pids']}/pids.max", str(limits.pids))
        cpu = self._dirs["cpu"]
        if not self._period_set:  # a new cgroup's period is the kernel's default, not ours
            write(f"{cpu}/cpu.cfs_period_us", str(CFS_PERIOD_US))
            self._period_set = True
        quota = -1 if limits.cpu_cores is None else cfs_quota_us(limits.cpu_cores)
        write(f"{cpu}/cpu.cfs_quota_us", str(quota))

    def _has_memsw(self) -> bool:
        if self._memsw is None:
            self._memsw = os.path.exists(f"{self._dirs['memory']}/memory.memsw.limit_in_bytes")
        return self._memsw

    def usage(self) -> CgroupUsage:
        mem = self._dirs["memory"]
        peak = int_or_zero(f"{mem}/memory.max_usage_in_bytes")
        oom = keyed(f"{mem}/memory.oom_control")
        failcnt = int_or_zero(f"{mem}/memory.failcnt")
        if "oom_kill" in oom:
            oom_killed = oom["oom_kill"] > 0
        else:
            # Kernels before 4.13 have no counter: infer it from hitting the limit or a stuck OOM.
            at_limit = peak >= int_or_zero(f"{mem}/memory.limit_in_bytes")
            oom_killed = oom.get("under_oom", 0) > 0 or (failcnt > 0 and at_limit)
        refused = keyed(f"{self._dirs['pids']}/pids.events").get("max", 0)
        return CgroupUsage(
            cpu_time_ns=int_or_zero(f"{self._dirs['cpuacct']}/cpuacct.usage"),
            memory_peak_bytes=peak,
            oom_killed=oom_killed,
            pids_limit_hit=refused > 0,
            memory_limit_hits=failcnt,
            pids_limit_hits=refused,
        )

    def kill_file(self) -> Path | None:
        return None  # v1 has no cgroup.kill: freeze, SIGKILL each member, thaw

    def freeze(self) -> bool:
        if "freezer" not in self._dirs:
            return False
        write(f"{self._dirs['freezer']}/freezer.state", "FROZEN")
        return True

    def frozen(self) -> bool:
        return read(f"{self._dirs['freezer']}/freezer.state").strip() == "FROZEN"

    def thaw(self) -> None:
        write(f"{self._dirs['freezer']}/freezer.state", "THAWED")
