"""Which sandbox lost a process to the enclosing cgroup's OOM killer, when the script survives.

Where sandboxes have no memory cgroup of their own (the degraded process backend), the kernel's
OOM killer of the cgroup enclosing the server (the pod's) kills a sandbox process and counts it in
the pod's ``oom_kill`` counter (`enclosing_oom`), but the counter says neither which process nor
which sandbox. A killed pid 1 is told apart by its SIGKILL death (`sandbox.execution.evidence`);
a killed child is reaped by the script, which goes on, and its exit status never reaches the
host. So the host correlates in time, at each sample of its accounting (`host_meter`, every
`sandbox.execution.drive.CPU_POLL_S`): it reads the pod's counter first, then walks the
sandbox's processes; a process of the sandbox that was alive at one walk and gone (exited or a
zombie) at the next, while the counter rose in that interval or the one before it (a kill is
counted before its victim exits, and the exit may land after the next walk has begun) or
within the last `WINDOW_S` (other readers of the usage, such as progress reports, sample more
often), is taken as a victim. Each kill the counter rose by is given to at most one process of
this sandbox.

What this cannot tell apart, and docs/limits.md says: a process of this sandbox that exited on
its own within the same sampling interval as a kill elsewhere in the pod is reported as a
victim too (the report errs towards the kill), and a process that forked, was killed and was
reaped entirely between two walks is not seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter

__all__ = ["WINDOW_S", "OomVictims"]

# Two host-accounting periods (`sandbox.execution.drive.CPU_POLL_S`, 50 ms).
WINDOW_S = 0.1


@dataclass
class _Kills:
    """Kills the counter rose by at one reading, not yet given to a process."""

    count: int
    seen_at: float
    walks: int = 0  # walks since that reading


class OomVictims:
    """One sandbox's processes taken by the enclosing cgroup's OOM killer, counted per sample."""

    def __init__(self, counter: EnclosingOomCounter) -> None:
        self._counter = counter
        self.kills_at_start = counter.read()
        self._count = self.kills_at_start
        self._unclaimed: list[_Kills] = []
        self._pids: frozenset[int] = frozenset()
        self.victims = 0

    def before_walk(self) -> None:
        """Reads the counter: call it just before the host walks the sandbox's processes."""
        count = self._counter.read()
        if count > self._count:
            self._unclaimed.append(_Kills(count - self._count, time.monotonic()))
            self._count = count

    def after_walk(self, pids: frozenset[int]) -> None:
        """The live processes the walk found: the ones gone since the last walk may be victims."""
        gone = len(self._pids - pids)
        self._pids = pids
        now = time.monotonic()
        for kills in self._unclaimed:
            kills.walks += 1
            claimed = min(gone, kills.count)
            kills.count -= claimed
            self.victims += claimed
            gone -= claimed
        self._unclaimed = [
            k for k in self._unclaimed if k.count and (k.walks < 2 or now - k.seen_at < WINDOW_S)
        ]

    def kills_since_start(self) -> int:
        """The kills the enclosing cgroup counted while this sandbox lived (any sandbox's)."""
        return max(0, self._counter.read() - self.kills_at_start)
