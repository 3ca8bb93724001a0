"""One process sandbox: forking it from the zygote, joining its cgroup, killing and reaping it.

Start-up is race-free with respect to the cgroup: the forked child waits for one byte on its
channel before it does anything else; the host moves it into the sandbox's fresh cgroup and only
then sends that byte. Every process the guest or the script ever creates is therefore born
inside the cgroup. The zygote runs as an unprivileged host uid, so even a kernel bug that let
the script out of its user namespace would leave it without privileges.

The sandbox's pid 1 is not our child but the zygote's. Where the kernel reports exit statuses
through pidfds (6.15 and newer) we hold a pidfd to pid 1 itself (the zygote forks it straight
into its pid namespace, or a first child forks it, tells us its host pid and exits), and the
kernel gives us the status once the zygote has reaped it. Elsewhere a reaper (that first child,
outside the sandbox's pid namespace) stays, writes pid 1's exit status to a pipe we read, and
dies with it; pid 1 dies with the reaper. Either way one SIGKILL through a pidfd (a reused pid
cannot be hit) kills pid 1 and with it, by the kernel's rule for a pid namespace's init, every
process inside.

A start runs on the event loop, with no worker thread: the fork request's reply and pid 1's
report are awaited through the loop, and the cgroup's creation and limits (a few dozen short
file writes) are made in between. A hop to a worker thread and back for each start cost more
host CPU than those writes (`bench.forkserver`: with the channel read on the loop and one
releasing thread, the host's CPU per execution went from 6.6 to 4.9 ms). Removing a finished
sandbox's cgroup, which can wait for the kernel, is the backend's releasing thread's
(`sandbox.backends.process.releaser`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace

from sandbox import epoll_readers
from sandbox.backends.base import ResourceUsage
from sandbox.backends.channel import FrameChannel
from sandbox.backends.process import pidfd as pidfds
from sandbox.backends.process.capabilities import process_capabilities, sandbox_isolation
from sandbox.backends.process.cgroups import CgroupLimits, CgroupManager, SandboxCgroup
from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.host_meter import ProcessTreeMeter
from sandbox.backends.process.oom_victims import OomVictims
from sandbox.backends.process.zygote import ZygoteSupervisor
from sandbox.backends.tmpfs import TmpfsProbe
from sandbox.capture import OutputStream
from sandbox.errors import Unavailable
from sandbox.limits import DEFAULTS, ResolvedLimits
from sandbox.protocol import ProtocolViolation

__all__ = ["ProcessSandbox", "SpawnSettings", "process_capabilities", "spawn_sandbox"]

CGROUP_CPU_CORES = 1.0
STATUS_MAX_BYTES = 64
PID_REPORT_TIMEOUT_S = 10.0  # the first child's set-up (namespaces, mounts) before it reports
# After pid 1's pidfd turns readable the zygote reaps it at once; should nobody reap it (the
# zygote died and the host's init does not reap), the status is unknown after this long.
EXIT_STATUS_WAIT_S = 2.0
log = logging.getLogger(__name__)


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
class _Started:
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


def cgroup_limits(limits: ResolvedLimits) -> CgroupLimits:
    return CgroupLimits(limits.memory_bytes, limits.processes, CGROUP_CPU_CORES)


class ProcessSandbox:
    """A started, ready sandbox; see `sandbox.backends.base.SandboxHandle`."""

    def __init__(
        self,
        started: _Started,
        channel: FrameChannel,
        stdout: OutputStream,
        stderr: OutputStream,
        tmp_bytes: int,
        host_accounting: bool = True,
        oom_counter: EnclosingOomCounter | None = None,
    ) -> None:
        self._started = started
        self._oom = (
            OomVictims(oom_counter, started.pid, reaper=started.status_fd >= 0)
            if oom_counter and started.cgroup is None
            else None
        )
        self.pid = started.pid
        self.cgroup = started.cgroup
        self.isolation = started.isolation
        self.channel = channel
        self.stdout = stdout
        self.stderr = stderr
        self.tmp_bytes = tmp_bytes
        self.reaper: Callable[[ProcessSandbox], None] | None = None
        self.on_disposed: Callable[[], None] | None = None  # the backend's count of the living
        self.applied = started.applied
        # Linux: the host measures the sandbox's tmpfs, which corroborates a SIGXFSZ first.
        self.capabilities = process_capabilities(self.cgroup is not None, host_accounting)
        self.meter = ProcessTreeMeter(started.pid) if self.capabilities.host_accounting else None
        self._host_peak_bytes = 0
        self._disposed = False
        self._fds_closed = False
        self._last_usage = ResourceUsage()
        self._final_usage = False  # read after the exit: nothing can change any more
        self._usage_read = False
        self.tmpfs = TmpfsProbe({})  # opened once the sandbox is ready (its mounts are made)
        self._status = bytearray()
        # Whether the host read pid 1's exit status (then no process of it is left: its uid may
        # go to another sandbox, `uid_range`), rather than concluding it died.
        self.exit_seen = False
        loop = asyncio.get_running_loop()
        self._exit: asyncio.Future[int] = loop.create_future()
        # Resolved once disposed of and gone: pid 1 exited, descriptors closed, namespaces and
        # cgroup handed to the reaper (`dispose`); a backend's close waits for it.
        self.released: asyncio.Future[None] = loop.create_future()
        self._readers = epoll_readers.for_loop(loop)
        if started.status_fd >= 0:
            self._readers.watch(started.status_fd, self._on_status)
        else:
            self._readers.watch(started.pidfd, self._on_exit)

    def _on_exit(self, waited_s: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        if waited_s == 0.0:
            self._readers.unwatch(self._started.pidfd)
        if self._exit.done():
            return
        try:
            code = pidfds.exit_status(self._started.pidfd)
        except OSError as exc:  # the descriptor was closed under us: disposal
            log.warning("sandbox %d: its exit status could not be read: %s", self.pid, exc)
            self._exit.set_result(-signal.SIGKILL)
            return
        if code is None:  # readable before the zygote has reaped it: a moment more
            if waited_s < EXIT_STATUS_WAIT_S:
                delay = min(0.05, 0.001 + waited_s)
                loop.call_later(delay, self._on_exit, waited_s + delay)
                return
            log.warning("sandbox %d exited but nobody reaped it: exit status unknown", self.pid)
            code = -signal.SIGKILL
        else:
            self.exit_seen = True
        self._exit.set_result(code)

    def _on_status(self) -> None:
        try:
            chunk = os.read(self._started.status_fd, STATUS_MAX_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk and len(self._status) < STATUS_MAX_BYTES:
            self._status += chunk
            return
        self._readers.unwatch(self._started.status_fd)
        if not self._exit.done():
            # The reaper writes the status after its waitpid: pid 1 reaped, its namespace empty.
            self.exit_seen = bytes(self._status).strip().lstrip(b"-").isdigit()
            self._exit.set_result(_exit_code(bytes(self._status)))

    @property
    def alive(self) -> bool:
        return not self._exit.done()

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        wanted = cgroup_limits(limits)
        if self.cgroup is not None and wanted != self.applied:
            self.cgroup.set_limits(wanted)
            self.applied = wanted

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def exit_future(self) -> asyncio.Future[int]:
        return self._exit

    async def kill(self) -> None:
        # SIGKILL to pid 1 (or to its reaper, whose death pid 1 follows by its parent-death
        # signal) is immediate and total: the kernel then kills every process in its pid
        # namespace.
        # The cgroup is swept once more (freeze, kill, remove) when the sandbox is disposed of.
        if self._fds_closed:
            return  # disposed of: the number may name another descriptor by now
        try:
            signal.pidfd_send_signal(self._started.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
        except OSError as exc:
            # EPERM: a server without CAP_KILL cannot signal the sandbox uid; the cgroup sweep
            # at disposal is then the only kill, and slower. Say so rather than hide it.
            log.warning("sandbox %d could not be killed through its pidfd: %s", self.pid, exc)

    def usage(self) -> ResourceUsage:
        # Once pid 1 has exited (its whole namespace with it) the figures are final: one read
        # after the exit serves the session's violations and the disposal alike. A run that
        # ended at its guest's hang-up reads them just before pid 1's exit: its CPU then lacks
        # the exit's own teardown, which is no part of the script's.
        if self._disposed or self._final_usage:
            return self._last_usage
        self._final_usage = self._exit.done()
        self._usage_read = True
        if self.cgroup is None:
            self._last_usage = ResourceUsage(tmpfs=self.tmpfs.sample())
            if self.meter is not None:
                # The private /tmp and /dev/shm are memory too (tmpfs pages: a memory cgroup
                # charges them), which no process's resident anonymous memory shows.
                tmpfs = self._last_usage.tmpfs
                if self._oom is not None and not self._final_usage:
                    self._oom.before_walk()
                now = self.meter.sample()
                if self._oom is not None and not self._final_usage:
                    self._oom.after_walk(now.pids)
                memory = now.memory_bytes + sum(t.used_bytes for t in tmpfs)
                self._host_peak_bytes = max(self._host_peak_bytes, memory)
                self._last_usage = ResourceUsage(
                    cpu_time_s=now.cpu_time_s,
                    peak_memory_bytes=self._host_peak_bytes,
                    host_accounted=True,
                    memory_bytes=memory,
                    tmpfs=tmpfs,
                )
            if self._oom is not None and (self._final_usage or self._oom.victims):
                # After the exit (the kernel counts a kill before its victim dies), or once a
                # victim was seen (a run that ends at its guest's hang-up reads before the exit).
                self._last_usage = replace(
                    self._last_usage,
                    enclosing_oom_kills=self._oom.kills_since_start(),
                    enclosing_oom_victims=self._oom.victims,
                )
            return self._last_usage
        with contextlib.suppress(OSError):
            usage = self.cgroup.usage()
            self._last_usage = ResourceUsage(
                cpu_time_s=usage.cpu_time_ns / 1e9,
                peak_memory_bytes=usage.memory_peak_bytes,
                oom_killed=usage.oom_killed,
                pids_limit_hit=usage.pids_limit_hit,
                accounted=True,
                memory_limit_hits=usage.memory_limit_hits,
                pids_limit_hits=usage.pids_limit_hits,
                peak_pids=usage.peak_pids,
                tmpfs=self.tmpfs.sample(),
            )
        return self._last_usage

    async def dispose(self) -> None:
        """Kills the sandbox; with a reaper, what must wait for pid 1's exit (its descriptors
        and cgroup) goes at that exit, off the request path: a guest that reported its end and
        hung up has its result before its exit (`sandbox.execution.single_use`), and the kernel's
        teardown of its memory and namespaces, a millisecond or two, is no part of it.
        `released` resolves once all of it is done."""
        if self._disposed:
            return
        if not self._usage_read:  # read once, as the run's outcome did: later reads get it
            self.usage()
        self._disposed = True
        if self.on_disposed is not None:
            self.on_disposed()
        self.tmpfs.close()
        await self.kill()
        await self.channel.close()
        if self.reaper is not None and not self._exit.done():
            self._exit.add_done_callback(self._after_exit)
            return
        await self._exit
        self._close_fds()
        if self.reaper is not None:
            self._hand_over()
        elif self.cgroup is not None:
            await asyncio.to_thread(self.release_leftovers)
        self._set_released()

    def _after_exit(self, _exit: asyncio.Future[int]) -> None:
        self._close_fds()
        self._hand_over()
        self._set_released()

    def _close_fds(self) -> None:
        self.stdout.close()
        self.stderr.close()
        self._fds_closed = True
        for fd in (self._started.pidfd, self._started.status_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _hand_over(self) -> None:
        """The cgroup goes in the reaper's background, off the request path."""
        if self.reaper is not None and self.cgroup is not None:
            self.reaper(self)

    def _set_released(self) -> None:
        if not self.released.done():
            self.released.set_result(None)

    def release_leftovers(self) -> None:
        """Removes the (already dead) sandbox's cgroup; blocking, milliseconds (an rmdir can
        find it busy for a moment and retry)."""
        if self.cgroup is not None:
            self.cgroup.remove()


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


def _exit_code(report: bytes) -> int:
    """The reaper's report of pid 1's exit; none at all means the reaper itself was killed,
    which only a kill of the whole sandbox (ours, or the kernel's OOM killer) does."""
    try:
        return int(report.strip() or b"")
    except ValueError:
        return -signal.SIGKILL


async def _start(
    zygote: ZygoteSupervisor, settings: SpawnSettings, cgroups: CgroupManager | None, name: str
) -> _Started:
    """Forks a child from the zygote, moves it into its cgroup, releases it."""
    host_sock, guest_sock = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    status_r, status_w = os.pipe()
    pidfd = -1
    cgroup: SandboxCgroup | None = None
    try:
        forked = await zygote.fork_async(
            settings.tmp_bytes, [guest_sock.fileno(), out_w, err_w, status_w]
        )
        pid = forked.pid
        for fd in (out_w, err_w, status_w):
            os.close(fd)
        out_w = err_w = status_w = -1
        guest_sock.close()
        pidfd = os.pidfd_open(pid)
        applied = None
        if cgroups is not None:
            cgroup = cgroups.create(name)
            applied = cgroup_limits(settings.limits)
            cgroup.set_limits(applied)
            cgroup.add_pids([pid])
        isolation = _isolation(settings, cgroups)
        host_sock.sendall(_go_ahead(settings))  # the child may go on: it is inside its cgroup
        if forked.init:
            # Born as pid 1 of its own pid namespace: the pidfd we hold is pid 1's already.
            if not pidfds.is_namespace_init(pid):
                raise OSError(f"pid {pid} forked as a sandbox's pid 1 is not one")
            os.close(status_r)
            status_r = -1
        elif zygote.settings.exit_status == "pidfd":
            # The first child reports pid 1 and exits: from now on we watch pid 1 itself.
            os.set_blocking(status_r, False)
            init = await _read_init_pid(status_r, err_r)
            init_fd = os.pidfd_open(init)
            if not pidfds.is_namespace_init(init):
                os.close(init_fd)
                raise OSError(f"pid {init} reported as the sandbox's pid 1 is not one")
            os.close(pidfd)
            pid, pidfd = init, init_fd
            os.close(status_r)
            status_r = -1
        else:
            os.set_blocking(status_r, False)
        return _Started(pid, pidfd, host_sock, out_r, err_r, status_r, cgroup, isolation, applied)
    except BaseException:
        if pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        if cgroup is not None:
            cgroup.remove()
        host_sock.close()
        for fd in (out_r, err_r, status_r):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, status_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        guest_sock.close()


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


async def _abandon(started: _Started, opened: list[OutputStream]) -> None:
    """Kills and releases a sandbox that never became ready; the output pipes already handed
    to an `OutputStream` (``opened``, in order: stdout, stderr) are closed by it."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(started.pidfd, signal.SIGKILL)
    for stream in opened:
        stream.close()
    unwrapped = [started.stdout_fd, started.stderr_fd][len(opened) :]
    for fd in (started.pidfd, started.status_fd, *unwrapped):
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    started.host_sock.close()
    if started.cgroup is not None:
        await asyncio.to_thread(started.cgroup.remove)


async def spawn_sandbox(
    zygote: ZygoteSupervisor,
    settings: SpawnSettings,
    cgroups: CgroupManager | None,
    name: str,
    reaper: Callable[[ProcessSandbox], None] | None = None,
) -> ProcessSandbox:
    """Forks one sandbox and waits until its guest is ready for a job."""
    starting = asyncio.ensure_future(_start(zygote, settings, cgroups, name))
    try:
        started = await asyncio.shield(starting)
    except asyncio.CancelledError:
        # A fork request in flight must get its reply (the zygote's control socket carries
        # one request at a time): let the start finish, then undo what it started.
        with contextlib.suppress(Exception):
            leftover = await starting
            await _abandon(leftover, [])
        raise
    except (OSError, ValueError) as exc:
        raise Unavailable(f"the process sandbox did not start: {exc!r}") from exc
    sandbox: ProcessSandbox | None = None
    channel: FrameChannel | None = None
    opened: list[OutputStream] = []
    try:
        channel = FrameChannel(started.host_sock, name, on_loop=True)
        opened.append(OutputStream.from_fd(started.stdout_fd))
        opened.append(OutputStream.from_fd(started.stderr_fd))
        stdout, stderr = opened
        sandbox = ProcessSandbox(
            started,
            channel,
            stdout,
            stderr,
            settings.tmp_bytes,
            settings.host_accounting,
            settings.oom_counter,
        )
        sandbox.reaper = reaper
        await sandbox.channel.ready(settings.ready_timeout_s)
        # The reaper made the sandbox's mounts before it forked pid 1, which said ready.
        sandbox.tmpfs = TmpfsProbe.open(started.pid)
        return sandbox
    except BaseException as exc:
        if sandbox is not None:
            await sandbox.dispose()
        else:
            if channel is not None:
                await channel.close()  # closes the host end of the socket
            await _abandon(started, opened)
        if isinstance(exc, (ProtocolViolation, TimeoutError, OSError, ValueError)):
            raise Unavailable(f"the process sandbox did not become ready: {exc!r}") from exc
        raise
