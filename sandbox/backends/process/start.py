"""The start of one process sandbox: forking it from the zygote, moving it into its cgroup,
releasing it, and finding the pid 1 the host then watches.

Start-up is race-free with respect to the cgroup: the forked child waits for one byte on its
channel before it does anything else; the host moves it into the sandbox's fresh cgroup and only
then sends that byte. Every process the guest or the script ever creates is therefore born
inside the cgroup. The zygote runs as an unprivileged host uid, so even a kernel bug that let
the script out of its user namespace would leave it without privileges.

Where the kernel reports exit statuses through pidfds (6.15 and newer) the host holds a pidfd
to pid 1 itself: the zygote forks it straight into its pid namespace, or a first child forks it,
tells us its host pid and exits. Elsewhere the first child stays as pid 1's reaper, and the
host holds a pidfd to it and reads pid 1's status from its pipe (`sandbox.backends.process.
sandbox` watches either).

A start runs on the event loop, with no worker thread: the fork request's reply and pid 1's
report are awaited through the loop, and the cgroup's creation and limits (a few dozen short
file writes) are made in between. A hop to a worker thread and back for each start cost more
host CPU than those writes (`bench.forkserver`: with the channel read on the loop and one
releasing thread, the host's CPU per execution went from 6.6 to 4.9 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from dataclasses import dataclass

from sandbox import epoll_readers
from sandbox.backends.process import pidfd as pidfds
from sandbox.backends.process.capabilities import sandbox_isolation
from sandbox.backends.process.cgroups import CgroupLimits, CgroupManager, SandboxCgroup
from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.zygote import Forked, ZygoteSupervisor
from sandbox.limits import DEFAULTS, ResolvedLimits

__all__ = ["STATUS_MAX_BYTES", "SpawnSettings", "Started", "cgroup_limits", "start_sandbox"]

CGROUP_CPU_CORES = 1.0
STATUS_MAX_BYTES = 64
PID_REPORT_TIMEOUT_S = 10.0  # the first child's set-up (namespaces, mounts) before it reports


@dataclass(frozen=True)
class SpawnSettings:
    tmp_bytes: int
    uid: int
    limits: ResolvedLimits = DEFAULTS
    ready_timeout_s: float = 15.0
    seccomp: bool = True  # the zygote installs the filter in each child; off only degraded
    # Without a cgroup: the host sums the sandbox's processes (`host_meter`) and stops it at
    # its memory or CPU limit.
    host_accounting: bool = True
    # Without a cgroup: the OOM kills of the server's own (enclosing) cgroup, read at the
    # sandbox's start and after its end.
    oom_counter: EnclosingOomCounter | None = None
    # The uid of this sandbox alone (`uid_range`), which its pid 1 takes; None: the zygote's.
    sandbox_uid: int | None = None


@dataclass
class Started:
    """A started sandbox's process, descriptors and cgroup, before its channel is served."""

    pid: int  # pid 1's host pid, or its reaper's
    pidfd: int
    host_sock: socket.socket
    stdout_fd: int
    stderr_fd: int
    status_fd: int  # the reaper's report of pid 1's exit; -1 when the pidfd tells
    cgroup: SandboxCgroup | None
    isolation: list[str]
    applied: CgroupLimits | None


@dataclass
class _Holding:
    """What a start holds until it succeeds or fails, so that a failure at any step releases
    exactly what was made: a descriptor is -1 once closed or not yet opened."""

    host_sock: socket.socket
    guest_sock: socket.socket
    out_r: int
    out_w: int
    err_r: int
    err_w: int
    status_r: int
    status_w: int
    pidfd: int = -1
    cgroup: SandboxCgroup | None = None

    @classmethod
    def open(cls) -> _Holding:
        host_sock, guest_sock = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        return cls(host_sock, guest_sock, out_r, out_w, err_r, err_w, status_r, status_w)

    def child_ends(self) -> list[int]:
        """The descriptors the forked child gets, in the zygote's order."""
        return [self.guest_sock.fileno(), self.out_w, self.err_w, self.status_w]

    def forked(self) -> None:
        """The child has its ends: ours are closed, so that its exit shows as end of file."""
        for fd in (self.out_w, self.err_w, self.status_w):
            os.close(fd)
        self.out_w = self.err_w = self.status_w = -1
        self.guest_sock.close()

    def close_child_ends(self) -> None:
        for fd in (self.out_w, self.err_w, self.status_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.guest_sock.close()

    def undo(self) -> None:
        """A failed start: kills what was forked, removes its cgroup, closes the host's ends."""
        if self.pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
        if self.cgroup is not None:
            self.cgroup.remove()
        self.host_sock.close()
        for fd in (self.out_r, self.err_r, self.status_r):
            if fd >= 0:
                os.close(fd)


def cgroup_limits(limits: ResolvedLimits) -> CgroupLimits:
    return CgroupLimits(limits.memory_bytes, limits.processes, CGROUP_CPU_CORES)


async def start_sandbox(
    zygote: ZygoteSupervisor, settings: SpawnSettings, cgroups: CgroupManager | None, name: str
) -> Started:
    """Forks a child from the zygote, moves it into its cgroup, releases it."""
    held = _Holding.open()
    try:
        forked = await zygote.fork_async(settings.tmp_bytes, held.child_ends())
        held.forked()
        held.pidfd = os.pidfd_open(forked.pid)
        applied = None
        if cgroups is not None:
            held.cgroup = cgroups.create(name)
            applied = cgroup_limits(settings.limits)
            held.cgroup.set_limits(applied)
            held.cgroup.add_pids([forked.pid])
        isolation = _isolation(settings, cgroups)
        held.host_sock.sendall(_go_ahead(settings))  # the child may go on: it is inside its cgroup
        pid = await _watch_pid_one(zygote, forked, held)
        return Started(
            pid, held.pidfd, held.host_sock, held.out_r, held.err_r, held.status_r,
            held.cgroup, isolation, applied,
        )  # fmt: skip
    except BaseException:
        held.undo()
        raise
    finally:
        held.close_child_ends()


async def _watch_pid_one(zygote: ZygoteSupervisor, forked: Forked, held: _Holding) -> int:
    """The host pid the sandbox is watched by from now on: pid 1's, whose pidfd ``held`` then
    holds, or (with a reaper) the first child's, whose status pipe is made non-blocking."""
    pid = forked.pid
    if forked.init:
        # Born as pid 1 of its own pid namespace: the pidfd we hold is pid 1's already.
        if not pidfds.is_namespace_init(pid):
            raise OSError(f"pid {pid} forked as a sandbox's pid 1 is not one")
        os.close(held.status_r)
        held.status_r = -1
        return pid
    os.set_blocking(held.status_r, False)
    if zygote.settings.exit_status != "pidfd":
        return pid
    # The first child reports pid 1 and exits: from now on we watch pid 1 itself.
    init = await _read_init_pid(held.status_r, held.err_r)
    init_fd = os.pidfd_open(init)
    if not pidfds.is_namespace_init(init):
        os.close(init_fd)
        raise OSError(f"pid {init} reported as the sandbox's pid 1 is not one")
    os.close(held.pidfd)
    held.pidfd = init_fd
    os.close(held.status_r)
    held.status_r = -1
    return init


async def _read_init_pid(status_r: int, err_r: int) -> int:
    """The host pid of the sandbox's pid 1, as the zygote's first child reports it (awaited
    through the event loop; ``status_r`` is non-blocking)."""
    loop = asyncio.get_running_loop()
    report = b""
    ended = False
    arrived: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        nonlocal report, ended
        try:
            chunk = os.read(status_r, STATUS_MAX_BYTES)
        except BlockingIOError:
            return
        report += chunk
        ended = not chunk
        if (ended or report.endswith(b"\n")) and not arrived.done():
            arrived.set_result(None)

    readers = epoll_readers.for_loop(loop)
    readers.watch(status_r, readable)
    try:
        async with asyncio.timeout(PID_REPORT_TIMEOUT_S):
            await arrived
    except TimeoutError:
        raise TimeoutError(f"no pid 1 reported in {PID_REPORT_TIMEOUT_S} s") from None
    finally:
        readers.unwatch(status_r)
    if ended:
        os.set_blocking(err_r, False)
        with contextlib.suppress(OSError):
            report += b" " + os.read(err_r, 2000)
        raise OSError(f"the sandbox's set-up failed: {report.decode(errors='replace')!r}")
    return int(report)


def _go_ahead(settings: SpawnSettings) -> bytes:
    """What lets a forked child go on (`sandbox.guest.zygote`): ``g``, or ``u`` and the uid in
    10 digits that its pid 1 takes (`uid_range`)."""
    uid = settings.sandbox_uid
    return b"g" if uid is None else b"u%010d" % uid


def _isolation(settings: SpawnSettings, cgroups: CgroupManager | None) -> list[str]:
    layers = cgroups.layers() if cgroups is not None else None
    return sandbox_isolation(
        settings.sandbox_uid, settings.uid, settings.seccomp, settings.host_accounting,
        settings.tmp_bytes, layers,
    )  # fmt: skip
