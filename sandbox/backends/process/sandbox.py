"""One process sandbox: spawning it under bubblewrap, joining its cgroup, killing and reaping it.

Start-up is race-free with respect to the cgroup: bwrap is told to wait on a pipe (`--block-fd`)
after creating its namespaces and before starting the guest; the host reads the sandbox's pid
from `--info-fd`, moves bwrap and that pid into the sandbox's fresh cgroup, and only then
releases the pipe. Every process the guest or the script ever creates is therefore born inside
the cgroup. bwrap runs as an unprivileged host uid, so even a kernel bug that let the script out
of its user namespace would leave it without privileges.

The blocking half of a start (fork/exec, reading the info pipe, cgroup writes, which take
milliseconds on cgroup v1) runs in a worker thread, so that refilling the warm pool never stalls
the event loop that is serving running executions. The exit is observed through a pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.base import ResourceUsage
from sandbox.backends.channel import FrameChannel
from sandbox.backends.process.bwrap import NAMESPACE_LAYERS, BwrapOptions, bwrap_argv
from sandbox.backends.process.cgroups import CgroupLimits, CgroupManager, SandboxCgroup
from sandbox.backends.process.seccomp import program_fd
from sandbox.capture import OutputStream
from sandbox.errors import Unavailable
from sandbox.limits import DEFAULTS, ResolvedLimits
from sandbox.protocol import ProtocolViolation

__all__ = ["ProcessSandbox", "SpawnSettings", "spawn_sandbox"]

BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
CGROUP_CPU_CORES = 1.0


@dataclass(frozen=True)
class SpawnSettings:
    python: str
    runtime_dir: Path
    tmp_bytes: int
    uid: int
    gid: int
    limits: ResolvedLimits = DEFAULTS
    ready_timeout_s: float = 15.0
    seccomp: bool = True  # filter syscalls (see `seccomp`); off only in a degraded mode


@dataclass
class _Started:
    """What the worker thread hands back to the event loop."""

    proc: subprocess.Popen[bytes]
    host_sock: socket.socket
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
        transports: list[asyncio.BaseTransport],
    ) -> None:
        self.proc = started.proc
        self.cgroup = started.cgroup
        self.isolation = started.isolation
        self.channel = channel
        self.stdout = stdout
        self.stderr = stderr
        self.tmp_bytes = tmp_bytes
        self._transports = transports
        self.reaper: Callable[[ProcessSandbox], None] | None = None
        self.applied = started.applied
        self.has_cgroup_cpu = self.cgroup is not None
        self.has_cgroup_pids = self.cgroup is not None
        self._disposed = False
        self._last_usage = ResourceUsage()
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pidfd = os.pidfd_open(self.proc.pid)
        asyncio.get_running_loop().add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        code = self.proc.wait()
        if not self._exit.done():
            self._exit.set_result(code)

    @property
    def alive(self) -> bool:
        return not self._exit.done()

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        wanted = cgroup_limits(limits)
        if self.cgroup is not None and wanted != self.applied:
            self.cgroup.set_limits(wanted)
            self.applied = wanted

    async def wait(self) -> int:
        code = await asyncio.shield(self._exit)
        # bwrap reports a guest killed by signal N as exit status 128 + N.
        if code > 128:
            return -(code - 128)
        return code

    async def kill(self) -> None:
        # SIGKILL to bwrap is immediate and total: --die-with-parent kills pid 1 of the
        # sandbox's pid namespace, and the kernel then kills every process in it. The cgroup is
        # swept once more (freeze, kill, remove) when the sandbox is disposed of.
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    def usage(self) -> ResourceUsage:
        if self.cgroup is None or self._disposed:
            return self._last_usage
        with contextlib.suppress(OSError):
            usage = self.cgroup.usage()
            self._last_usage = ResourceUsage(
                cpu_time_s=usage.cpu_time_ns / 1e9,
                peak_memory_bytes=usage.memory_peak_bytes,
                oom_killed=usage.oom_killed,
                pids_limit_hit=usage.pids_limit_hit,
            )
        return self._last_usage

    async def dispose(self) -> None:
        if self._disposed:
            return
        self.usage()
        self._disposed = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        await self.channel.close()
        await self._exit
        os.close(self._pidfd)
        for transport in self._transports:
            transport.close()
        if self.cgroup is None:
            return
        if self.reaper is not None:
            self.reaper(self)  # the cgroup goes in the background, off the request path
        else:
            await asyncio.to_thread(self.release_cgroup)

    def release_cgroup(self) -> None:
        """Removes the (already killed) sandbox's cgroup; blocking, milliseconds on v1."""
        if self.cgroup is not None:
            self.cgroup.remove()


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _start_blocking(settings: SpawnSettings, cgroups: CgroupManager | None, name: str) -> _Started:
    """Fork/exec bwrap, move it into its cgroup, release it. Runs in a worker thread."""
    host_sock, guest_sock = socket.socketpair()
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    seccomp_fd = -1
    as_user: dict[str, object] = {}
    if os.getuid() == 0:
        as_user = {"user": settings.uid, "group": settings.gid, "extra_groups": []}
    proc: subprocess.Popen[bytes] | None = None
    cgroup: SandboxCgroup | None = None
    try:
        if settings.seccomp:
            seccomp_fd = program_fd()
        argv = bwrap_argv(
            BwrapOptions(
                python=settings.python,
                runtime_dir=settings.runtime_dir,
                tmp_bytes=settings.tmp_bytes,
                uid=settings.uid,
                gid=settings.gid,
                info_fd=info_w,
                block_fd=block_r,
                channel_fd=guest_sock.fileno(),
                seccomp_fd=seccomp_fd if seccomp_fd >= 0 else None,
            )
        )
        proc = subprocess.Popen(  # type: ignore[call-overload]
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(
                fd for fd in (guest_sock.fileno(), info_w, block_r, seccomp_fd) if fd >= 0
            ),
            start_new_session=True,
            # bwrap's own process is pid 1 inside the sandbox and its /proc/1/environ is
            # readable there: it must not inherit the server's environment.
            env=BWRAP_ENV,
            **as_user,
        )
        assert proc is not None
        os.close(info_w)
        info_w = -1
        guest_sock.close()
        info = _read_all(info_r)
        if not info:
            assert proc.stderr is not None
            proc.wait(timeout=10)
            err = proc.stderr.read(4000).decode(errors="replace").strip()
            raise Unavailable(f"the process sandbox did not start: {err or 'no reason given'}")
        child_pid = int(json.loads(info)["child-pid"])
        isolation = [*NAMESPACE_LAYERS, f"uid:{settings.uid if as_user else os.getuid()}"]
        if settings.seccomp:
            isolation.append("seccomp")
        applied = None
        if cgroups is not None:
            cgroup = cgroups.create(name)
            applied = cgroup_limits(settings.limits)
            cgroup.set_limits(applied)
            cgroup.add_pids([proc.pid, child_pid])
            isolation += cgroups.layers()
        isolation += ["rlimits", f"tmpfs:{settings.tmp_bytes}"]
        os.write(block_w, b"1")
        return _Started(proc, host_sock, cgroup, isolation, applied)
    except BaseException:
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if cgroup is not None:
            cgroup.remove()
        host_sock.close()
        raise
    finally:
        for fd in (info_r, info_w, block_r, block_w, seccomp_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        guest_sock.close()


async def _output_stream(pipe: object) -> tuple[OutputStream, asyncio.BaseTransport]:
    transport, stream = await asyncio.get_running_loop().connect_read_pipe(OutputStream, pipe)
    return stream, transport


async def _abandon(started: _Started, opened: list[asyncio.BaseTransport]) -> None:
    """Kills and releases a sandbox that never became ready."""
    with contextlib.suppress(ProcessLookupError):
        started.proc.kill()
    await asyncio.to_thread(started.proc.wait)
    for resource in opened:
        resource.close()
    started.host_sock.close()
    for pipe in (started.proc.stdout, started.proc.stderr):
        if pipe is not None:
            pipe.close()  # a no-op for a pipe its transport already closed
    if started.cgroup is not None:
        await asyncio.to_thread(started.cgroup.remove)


async def spawn_sandbox(
    settings: SpawnSettings,
    cgroups: CgroupManager | None,
    name: str,
    reaper: Callable[[ProcessSandbox], None] | None = None,
) -> ProcessSandbox:
    """Starts one sandbox and waits until its guest is ready for a job."""
    starting = asyncio.ensure_future(asyncio.to_thread(_start_blocking, settings, cgroups, name))
    try:
        started = await asyncio.shield(starting)
    except asyncio.CancelledError:
        # The thread cannot be interrupted: let it finish, then undo what it started.
        with contextlib.suppress(Exception):
            leftover = await starting
            await _abandon(leftover, [])
        raise
    except (OSError, ValueError, KeyError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"the process sandbox did not start: {exc!r}") from exc
    sandbox: ProcessSandbox | None = None
    channel: FrameChannel | None = None
    opened: list[asyncio.BaseTransport] = []
    try:
        channel = FrameChannel(started.host_sock, name)
        stdout, out_transport = await _output_stream(started.proc.stdout)
        opened.append(out_transport)
        stderr, err_transport = await _output_stream(started.proc.stderr)
        opened.append(err_transport)
        sandbox = ProcessSandbox(
            started,
            channel,
            stdout,
            stderr,
            settings.tmp_bytes,
            [out_transport, err_transport],
        )
        sandbox.reaper = reaper
        await sandbox.channel.ready(settings.ready_timeout_s)
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
