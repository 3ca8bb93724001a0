"""What a sandbox cgroup's limits and usage are, and the one interface each cgroup version
implements (`CgroupControls`): writing the limits, reading the usage, and the kernel's ways to
kill or freeze the whole group. `v1.py` and `v2.py` implement it; nothing else in the package
knows which version it runs on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["CFS_PERIOD_US", "CgroupControls", "CgroupLimits", "CgroupUsage", "cfs_quota_us"]

CFS_PERIOD_US = 100_000
_CFS_MIN_QUOTA_US = 1_000


@dataclass(frozen=True)
class CgroupLimits:
    """Whole-sandbox limits. ``cpu_cores`` of ``None`` means no CPU bandwidth cap."""

    memory_bytes: int
    pids: int
    cpu_cores: float | None

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive, got {self.memory_bytes}")
        if self.pids <= 0:
            raise ValueError(f"pids must be positive, got {self.pids}")
        if self.cpu_cores is not None and not self.cpu_cores > 0:
            raise ValueError(f"cpu_cores must be positive or None, got {self.cpu_cores}")


@dataclass(frozen=True)
class CgroupUsage:
    """What the sandbox used; every field covers all of its processes, dead or alive."""

    cpu_time_ns: int
    memory_peak_bytes: int
    oom_killed: bool
    pids_limit_hit: bool
    memory_limit_hits: int = 0  # charges that reached the limit (each one reclaimed or failed)
    pids_limit_hits: int = 0  # process or thread creations refused at pids.max
    peak_pids: int | None = None  # None where the kernel keeps no peak (v1, v2 before 6.1)


class CgroupControls(Protocol):
    """One sandbox cgroup's version-specific files, given its directory per controller."""

    version: Literal[1, 2]

    def set_limits(self, limits: CgroupLimits) -> None:
        """Writes every limit; may be called again (before the job starts) to change them."""

    def usage(self) -> CgroupUsage:
        """Totals since creation."""

    def kill_file(self) -> Path | None:
        """The file whose write kills the whole group at once (v2's ``cgroup.kill``), if any."""

    def freeze(self) -> bool:
        """Starts freezing every task; False when there is no freezer."""

    def frozen(self) -> bool: ...

    def thaw(self) -> None: ...


def cfs_quota_us(cores: float) -> int:
    return max(_CFS_MIN_QUOTA_US, round(cores * CFS_PERIOD_US))
