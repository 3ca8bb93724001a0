"""Host accounting: a sandbox's CPU time and memory summed over all its processes, from /proc.

Where no cgroup of its own counts a sandbox (the degraded process backend: a read-only cgroup
filesystem, as in the Kubernetes base), RLIMIT_CPU and RLIMIT_AS bound each process alone, and a
script of N processes may use N times its limits. The host closes that gap by measuring the
sandbox as a whole: its processes are the descendants of the process the host forked for it
(the sandbox's pid 1, or the reaper above it), found through each task's
`/proc/PID/task/TID/children`, and for each the host reads `/proc/PID/stat` and
`/proc/PID/statm`, which need no ptrace access (a server without CAP_SYS_PTRACE, as in the
Kubernetes base, reads them):

- **CPU time**: utime + stime of every live process, plus cutime + cstime (what its reaped
  children used), so a child that came and went between two samples is still counted once its
  parent (or the sandbox's pid 1, which reaps orphans) has waited for it.
- **memory**: each process's resident anonymous memory (statm's resident less its shared,
  file-backed and shmem, pages: libraries and the page cache are shared and reclaimable); the
  sandbox adds what its private `/tmp` and `/dev/shm` hold (`TmpfsProbe`), as a memory cgroup
  would charge those pages. A page that a forked child still shares copy-on-write with its
  parent counts once per process: the sum errs high, never low, but for one sample of a
  forked child, as follows.

  The exception is a child between its fork and its exec. Its anonymous memory is then its
  parent's, copy-on-write, and counted whole it is the parent's once more per child: a fork bomb
  of 63 `fork` + `execv` children of a 16 MiB interpreter, sampled while the children waited for
  a CPU to exec (a CI run at load 7 on 2 cores), summed past 256 MiB and was killed for `memory`
  while it really used a fraction of it. So a process the walk finds for the first time that
  was forked and has not exec'd since (the kernel's PF_FORKNOEXEC), below a parent of the
  sandbox, counts no more than the pages it has faulted in itself (its minor and major faults,
  counted from zero at the fork; one page each, more where a huge page was mapped): what it did
  not fault in it still shares with its parent, or shared until at most one sample ago. From
  the next walk on it counts whole again, as every process does, so what that first sample
  misses is of the kind docs/limits.md lists: what processes can touch between two samples.

The drive loop samples every `sandbox.execution.drive.CPU_POLL_S` (50 ms) and stops the sandbox
when a sum passes its limit (docs/limits.md says what can slip between two samples).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ProcessTreeMeter", "TreeSample", "children", "running", "sigkill_pending"]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# The kernel's flags (stat field 9, include/linux/sched.h): a task that has begun to exit; a
# task forked and not exec'd since.
_PF_EXITING = 0x4
_PF_FORKNOEXEC = 0x40
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)  # in a pending-signal mask of /proc/PID/status
# A sandbox holds at most `processes` (<= 1024) tasks; a walk that finds more than this is not
# looking at one sandbox any more (a reused pid): it stops rather than read the host's /proc.
_MAX_PROCESSES = 4096


@dataclass(frozen=True)
class TreeSample:
    """One reading of a sandbox's processes."""

    cpu_time_s: float  # user + system, live processes and their reaped children
    memory_bytes: int  # resident anonymous memory, summed
    processes: int  # processes found (threads are not counted here)
    # The live ones (zombies and exiting processes are going: `oom_victims` watches them go).
    pids: frozenset[int] = frozenset()


class ProcessTreeMeter:
    """Sums the processes below one host pid; keeps the highest memory seen and the last CPU."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.peak_memory_bytes = 0
        self.cpu_time_s = 0.0
        self.last = TreeSample(0.0, 0, 0)
        # Every process the last walk found, live or ending: a forked child's first walk is the
        # one where it is not among them (the module's docstring).
        self._seen: frozenset[int] = frozenset()

    def sample(self) -> TreeSample:
        """Reads every process of the tree now. A process that exits mid-walk is skipped (its
        CPU reaches its parent's cutime once reaped); once the root is gone the last figures
        stand (CPU time never goes down)."""
        cpu_ticks = 0
        resident_pages = 0
        found = 0
        live: list[int] = []
        seen: list[int] = []
        pending = [(self.root_pid, False)]  # (pid, whether its parent is in the sandbox)
        while pending and found < _MAX_PROCESSES:
            pid, below = pending.pop()
            read = _read_process(pid)
            if read is None:
                continue
            cpu_ticks += read.ticks
            pages = read.anon_pages
            if below and read.fork_no_exec and pid not in self._seen:
                pages = min(pages, read.faults)
            resident_pages += pages
            found += 1
            seen.append(pid)
            if not read.ending:
                live.append(pid)
            pending.extend((child, True) for child in _children(pid, read.threads))
        if not found:
            return self.last
        self._seen = frozenset(seen)
        cpu = max(self.cpu_time_s, cpu_ticks / _TICKS_PER_S)
        sample = TreeSample(cpu, resident_pages * _PAGE_BYTES, found, frozenset(live))
        self.cpu_time_s = cpu
        self.peak_memory_bytes = max(self.peak_memory_bytes, sample.memory_bytes)
        self.last = sample
        return sample


def children(pid: int) -> list[int]:
    """The children of every thread of ``pid``."""
    return _children(pid, 2)


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not begun to exit: a walk through the `children`
    files can miss a live process while a sibling exits or forks (the kernel lists them by
    position), so a process missing from a walk is asked for directly."""
    read = _read_process(pid)
    return read is not None and not read.ending


def sigkill_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGKILL sent and not yet acted on (its process-wide or thread's
    pending signals in /proc/PID/status, which needs no ptrace access): a process being killed
    that has not yet run to its exit."""
    try:
        status = _read_status(pid)
    except OSError:
        return False
    for line in status.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"SigPnd", b"ShdPnd"):
            with contextlib.suppress(ValueError):
                if int(value.strip(), 16) & _SIGKILL_BIT:
                    return True
    return False


def _read_status(pid: int) -> bytes:
    """/proc/PID/status whole (about 1.5 KiB; its signal lines come after the first 4 KiB only
    with very long group lists)."""
    fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 16384):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _Process(NamedTuple):
    """What one walk reads of one process."""

    ticks: int  # CPU ticks, with its reaped children's
    anon_pages: int  # resident anonymous pages (statm's resident less shared)
    threads: int
    ending: bool  # a zombie, or exiting, as a process killed with SIGKILL is once it runs
    fork_no_exec: bool  # forked and not exec'd since (PF_FORKNOEXEC)
    faults: int  # minor + major page faults of the process (zero at its fork)


def _read(path: str) -> bytes:
    """A small /proc file in one read (no buffered file object: a sample is on the event loop,
    and `open()` costs several times the system calls' own time)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _children(pid: int, threads: int) -> list[int]:
    """The children of every thread of ``pid`` (a process forked from a thread is listed under
    that thread, not under the main one); one read for a single-threaded process."""
    try:
        tids = [str(pid)] if threads <= 1 else os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tids:
        try:
            out.extend(int(child) for child in _read(f"/proc/{pid}/task/{tid}/children").split())
        except OSError:
            continue
    return out


def _read_process(pid: int) -> _Process | None:
    """One process's figures, or None when it is gone."""
    try:
        raw = _read(f"/proc/{pid}/stat")
        pages = _read(f"/proc/{pid}/statm").split()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after
    # the last ')'. From there: state (3) ... flags (9), minflt (10), cminflt, majflt (12), ...
    # utime (14), stime, cutime, cstime (17), ... num_threads (20).
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
        threads = int(fields[17])
        flags = int(fields[6])
        faults = int(fields[7]) + int(fields[9])
        resident, shared = int(pages[1]), int(pages[2])
    except (IndexError, ValueError):
        return None
    ending = fields[0] == b"Z" or bool(flags & _PF_EXITING)
    return _Process(
        ticks,
        max(0, resident - shared),
        threads,
        ending,
        bool(flags & _PF_FORKNOEXEC),
        faults,
    )
