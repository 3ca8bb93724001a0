"""One process sandbox: spawning it under bubblewrap, joining its cgroup, killing and reaping it.

Start-up is race-free with respect to the cgroup: bwrap is told to wait on a pipe (`--block-fd`)
after creating its namespaces and before starting the guest; the host reads the sandbox's pid
from `--info-fd`, moves bwrap and that pid into the sandbox's fresh cgroup, and only then
releases the pipe. Every process the guest or the script ever creates is therefore born inside
the cgroup. bwrap runs as an unprivileged host uid, so even a kernel bug that let the script out
of its user namespace would leave it without privileges.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.backends.base import ResourceUsage
from sandbox.backends.process.bwrap import NAMESPACE_LAYERS, BwrapOptions, bwrap_argv
from sandbox.backends.process.cgroups import CgroupLimits, CgroupManager, SandboxCgroup
from sandbox.errors import Unavailable
from sandbox.limits import ResolvedLimits
from sandbox.protocol import GuestReady, ProtocolViolation, parse_guest_message, read_frame

__all__ = ["ProcessSandbox", "SpawnSettings", "spawn_sandbox"]

READY_FRAME_BYTES = 4096
BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
CGROUP_CPU_CORES = 1.0


@dataclass(frozen=True)
class SpawnSettings:
    python: str
    runtime_dir: Path
    tmp_bytes: int
    uid: int
    gid: int
    ready_timeout_s: float = 15.0


class ProcessSandbox:
    """A started, ready sandbox; see `sandbox.backends.base.SandboxHandle`."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cgroup: SandboxCgroup | None,
        isolation: list[str],
        tmp_bytes: int,
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.channel_reader = reader
        self.channel_writer = writer
        self.stdout: asyncio.StreamReader = proc.stdout
        self.stderr: asyncio.StreamReader = proc.stderr
        self.cgroup = cgroup
        self.isolation = isolation
        self.tmp_bytes = tmp_bytes
        self.has_cgroup_cpu = cgroup is not None
        self.has_cgroup_pids = cgroup is not None
        self.created = time.monotonic()
        self._disposed = False
        self._last_usage = ResourceUsage()

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        if self.cgroup is not None:
            self.cgroup.set_limits(
                CgroupLimits(limits.memory_bytes, limits.processes, CGROUP_CPU_CORES)
            )

    async def wait(self) -> int:
        code = await self.proc.wait()
        # bwrap reports a guest killed by signal N as exit status 128 + N.
        if code > 128:
            return -(code - 128)
        return code

    async def kill(self) -> None:
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.cgroup.kill_all)
        # Killing bwrap takes its namespace with it (--die-with-parent kills pid 1 inside).
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
        self.channel_writer.close()
        with contextlib.suppress(Exception):
            await self.channel_writer.wait_closed()
        await self.proc.wait()
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


async def spawn_sandbox(
    settings: SpawnSettings, cgroups: CgroupManager | None, name: str
) -> ProcessSandbox:
    """Starts one sandbox and waits until its guest is ready for a job."""
    host_sock, guest_sock = socket.socketpair()
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
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
        )
    )
    as_user: dict[str, object] = {}
    if os.getuid() == 0:
        as_user = {"user": settings.uid, "group": settings.gid, "extra_groups": []}
    cgroup: SandboxCgroup | None = None
    proc: asyncio.subprocess.Process | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(guest_sock.fileno(), info_w, block_r),
            start_new_session=True,
            # bwrap's own process is pid 1 inside the sandbox and its /proc/1/environ is
            # readable there: it must not inherit the server's environment.
            env=BWRAP_ENV,
            **as_user,  # type: ignore[arg-type]
        )
        os.close(info_w)
        info_w = -1
        guest_sock.close()
        info = await asyncio.to_thread(_read_all, info_r)
        if not info:
            assert proc.stderr is not None
            err = (await proc.stderr.read(4000)).decode(errors="replace").strip()
            raise Unavailable(f"the process sandbox did not start: {err or 'no reason given'}")
        child_pid = int(json.loads(info)["child-pid"])
        isolation = [*NAMESPACE_LAYERS, f"uid:{settings.uid if as_user else os.getuid()}"]
        if cgroups is not None:
            cgroup = cgroups.create(name)
            cgroup.add_pids([proc.pid, child_pid])
            isolation += cgroups.layers()
        isolation += ["rlimits", f"tmpfs:{settings.tmp_bytes}"]
        os.write(block_w, b"1")
        reader, writer = await asyncio.open_unix_connection(sock=host_sock)
        frame = await asyncio.wait_for(
            read_frame(reader, READY_FRAME_BYTES), settings.ready_timeout_s
        )
        if not isinstance(parse_guest_message(frame), GuestReady):
            raise ProtocolViolation("the guest did not say ready")
        return ProcessSandbox(proc, reader, writer, cgroup, isolation, settings.tmp_bytes)
    except BaseException as exc:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if cgroup is not None:
            cgroup.remove()
        host_sock.close()
        if isinstance(exc, (ProtocolViolation, TimeoutError, OSError, ValueError, KeyError)):
            raise Unavailable(f"the process sandbox did not become ready: {exc!r}") from exc
        raise
    finally:
        for fd in (info_r, info_w, block_r, block_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if not guest_sock._closed:  # type: ignore[attr-defined]
            guest_sock.close()
