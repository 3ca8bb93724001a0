"""One process sandbox once started: watching its exit, killing it, reading its usage, and its
disposal; and `spawn_sandbox`, which starts one (`sandbox.backends.process.start`) and waits
until its guest is ready.

The sandbox's pid 1 is not our child but the zygote's. Where the kernel reports exit statuses
through pidfds (6.15 and newer) we hold a pidfd to pid 1 itself (the zygote forks it straight
into its pid namespace, or a first child forks it, tells us its host pid and exits), and the
kernel gives us the status once the zygote has reaped it. Elsewhere a reaper (that first child,
outside the sandbox's pid namespace) stays, writes pid 1's exit status to a pipe we read, and
dies with it; pid 1 dies with the reaper. Either way one SIGKILL through a pidfd (a reused pid
cannot be hit) kills pid 1 and with it, by the kernel's rule for a pid namespace's init, every
process inside.

Removing a finished sandbox's cgroup, which can wait for the kernel, is the backend's releasing
thread's (`sandbox.backends.process.releaser`), off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace

from sandbox import epoll_readers
from sandbox.backends.base import ResourceUsage
from sandbox.backends.channel import FrameChannel
from sandbox.backends.process import pidfd as pidfds
from sandbox.backends.process.capabilities import process_capabilities
from sandbox.backends.process.cgroups import CgroupManager
from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.host_meter import ProcessTreeMeter
from sandbox.backends.process.oom_victims import OomVictims
from sandbox.backends.process.start import (
    STATUS_MAX_BYTES,
    SpawnSettings,
    Started,
    cgroup_limits,
    start_sandbox,
)
from sandbox.backends.process.zygote import ZygoteSupervisor
from sandbox.backends.tmpfs import TmpfsProbe
from sandbox.capture import OutputStream
from sandbox.errors import Unavailable
from sandbox.limits import ResolvedLimits
from sandbox.protocol import ProtocolViolation

__all__ = ["ProcessSandbox", "process_capabilities", "spawn_sandbox"]

# After pid 1's pidfd turns readable the zygote reaps it at once; should nobody reap it (the
# zygote died and the host's init does not reap), the status is unknown after this long.
EXIT_STATUS_WAIT_S = 2.0
log = logging.getLogger(__name__)


class ProcessSandbox:
    """A started, ready sandbox; see `sandbox.backends.base.SandboxHandle`."""

    def __init__(
        self,
        started: Started,
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
                now = self.meter.sample()
                if self._oom is not None and not self._final_usage:
                    self._oom.walked(now.pids)
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


def _exit_code(report: bytes) -> int:
    """The reaper's report of pid 1's exit; none at all means the reaper itself was killed,
    which only a kill of the whole sandbox (ours, or the kernel's OOM killer) does."""
    try:
        return int(report.strip() or b"")
    except ValueError:
        return -signal.SIGKILL


async def _abandon(started: Started, opened: list[OutputStream]) -> None:
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
    starting = asyncio.ensure_future(start_sandbox(zygote, settings, cgroups, name))
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
