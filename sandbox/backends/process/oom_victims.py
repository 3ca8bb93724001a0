"""Which sandbox lost a process to the enclosing cgroup's OOM killer, when the script survives.

Where sandboxes have no memory cgroup of their own (the degraded process backend), the kernel's
OOM killer of the cgroup enclosing the server (the pod's) kills a sandbox process and counts it in
the pod's ``oom_kill`` counter (`enclosing_oom`), but the counter says neither which process nor
which sandbox. A killed pid 1 is told apart by its SIGKILL death (`sandbox.execution.evidence`);
a killed child is reaped by the script, which goes on, and its exit status never reaches the
host. So the host correlates in time, at each sample of its accounting (`host_meter`, every
`sandbox.execution.drive.CPU_POLL_S`): it walks the sandbox's processes, then reads the pod's
counter; a process of the sandbox that was alive at one walk and gone (exited, exiting or a
zombie) at the next, while the counter rose at the reading after that walk or at one of the
two before it, or within the last `WINDOW_S` (a kill is counted before its victim exits, and the
victim exits only once it is scheduled, which under memory pressure on a loaded machine may
take a few samples; other readers of the usage, such as progress reports, sample more often),
is taken as a victim (one missing from the walk but still running was only missed: the
`children` files the walk reads can skip a live process). A process of the sandbox with a
SIGKILL pending (its /proc status, readable without ptrace) while a kill is unclaimed is taken
at once, without waiting for it to go: a victim stuck in the kernel may take longer than the
window to exit. Each kill the counter rose by is given to at most one process of this sandbox.

The counter is read after the walk, never before it: the kernel counts a kill before it sends
the SIGKILL, so every victim the walk found gone has its kill in a reading taken after the walk.
Read before the walk, a kill landing between the reading and the walk, its victim gone by the
walk, was lost: the walk saw the process gone while the counter had not risen, and the next
reading's rise found no process gone. Under memory pressure that is no rare interleaving: the
server's own allocation during the walk can be what hits the pod's limit, and the kernel then
kills a sandbox process and holds the server until the victim's memory is freed (a CI run at
load 7 on 2 cores lost a child's kill so, `tests/deploy/test_kubernetes_pod_oom.py`).

Its first processes (pid 1, and its reaper where it has one) are never taken: once one of them
ends, the sandbox is ending, every other process dies with it, and nothing more is taken (a kill
of pid 1 is told by its exit status instead).

What this cannot tell apart, and docs/limits.md says: a process of this sandbox that exited on
its own within that window of a kill elsewhere in the pod is reported as a victim too (the
report errs towards the kill); a process that forked, was killed and was reaped entirely
between two walks is not seen, nor one killed within a sample of the sandbox's end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.host_meter import children, running, sigkill_pending

__all__ = ["WINDOW_S", "OomVictims"]

# Five host-accounting periods (`sandbox.execution.drive.CPU_POLL_S`, 50 ms): an OOM victim
# exits once it is scheduled, which on a loaded machine under memory pressure takes a while.
WINDOW_S = 0.25


@dataclass
class _Kills:
    """Kills the counter rose by at one reading, not yet given to a process."""

    count: int
    seen_at: float
    walks: int = 0  # walks since that reading


class OomVictims:
    """One sandbox's processes taken by the enclosing cgroup's OOM killer, counted per sample."""

    def __init__(self, counter: EnclosingOomCounter, root_pid: int, reaper: bool) -> None:
        """``root_pid``: the process the host walks from, the sandbox's pid 1 or, with
        ``reaper``, the reaper whose one child pid 1 is."""
        self._counter = counter
        self._root = root_pid
        self._reaper = reaper
        self.kills_at_start = counter.read()
        self._count = self.kills_at_start
        self._unclaimed: list[_Kills] = []
        self._pids: frozenset[int] = frozenset()
        self._first: frozenset[int] = frozenset()
        self._ending = False
        self._dying: set[int] = set()  # taken as victims before they were gone
        self.victims = 0

    def walked(self, pids: frozenset[int]) -> None:
        """The live processes the host's walk just found: reads the counter (after the walk,
        the module's docstring says why), and the processes gone since the last walk may be
        victims of the kills it rose by."""
        count = self._counter.read()
        if not self._pids:
            # No process seen yet (the first walk of a warm sandbox): no process of it can have
            # ended, and kills counted while it waited in the pool are another sandbox's.
            self._count = max(count, self._count)
        elif count > self._count:
            self._unclaimed.append(_Kills(count - self._count, time.monotonic()))
            self._count = count
        if not self._first:
            below = children(self._root) if self._reaper else []
            self._first = frozenset([self._root, *below])
        missing = self._pids - pids
        still = {pid for pid in missing if running(pid)}  # missed by the walk, not gone
        self._pids = pids | still
        if self._ending or (missing - still) & self._first:
            # Its first process is ending, and every other dies with it: the sandbox's own end
            # (or the kernel's kill of that process, which its exit status tells).
            self._ending = True
            return
        # A process already taken while it was dying is not taken again when it goes.
        gone = len(missing - still - self._dying)
        self._dying -= missing - still
        now = time.monotonic()
        for kills in self._unclaimed:
            kills.walks += 1
            claimed = min(gone, kills.count)
            kills.count -= claimed
            self.victims += claimed
            gone -= claimed
        if any(kills.count for kills in self._unclaimed):
            # A victim not yet gone, its SIGKILL pending (one stuck in the kernel, as under
            # memory pressure, may not exit within the window): taken now.
            dying = [pid for pid in self._pids - self._first - self._dying if sigkill_pending(pid)]
            for kills in self._unclaimed:
                claimed = min(len(dying), kills.count)
                kills.count -= claimed
                self.victims += claimed
                self._dying.update(dying[:claimed])
                dying = dying[claimed:]
        self._unclaimed = [
            k for k in self._unclaimed if k.count and (k.walks < 3 or now - k.seen_at < WINDOW_S)
        ]

    def kills_since_start(self) -> int:
        """The kills the enclosing cgroup counted while this sandbox lived (any sandbox's)."""
        return max(0, self._counter.read() - self.kills_at_start)
