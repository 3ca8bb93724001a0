"""One container sandbox: starting it until its guest is ready, ending it, and reading its fate.

A pool container is created and started ahead of demand; its guest connects to the host's
sockets, says `ready` and waits for its job, so taking one costs no engine call at all. Ending
is fast too when the engine runs on this host: the container's init process is watched with a
pidfd (exit noticed at once, kill with one signal, no API round trip), the exit code is the one
in the guest's `end` frame (as the channel thread read it, see `sandbox.backends.channel`), and
the cgroup counters are read straight from the cgroup filesystem. When that shortcut is not
there (a remote engine, no end frame, the host killed the sandbox), the engine's own wait and
inspect are the authority, and its `State.OOMKilled` reports an out-of-memory kill.
Removal runs in the background after use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import docker.errors
from docker import DockerClient
from docker.models.containers import Container

from sandbox.backends.base import ResourceUsage
from sandbox.backends.docker.cgroup import CgroupCounters, ContainerCgroup
from sandbox.backends.docker.channel import Connected, HostSockets
from sandbox.backends.docker.oom_watch import oom_watch
from sandbox.backends.docker.spec import (
    ContainerSettings,
    container_capabilities,
    container_kwargs,
    isolation_layers,
)
from sandbox.backends.tmpfs import TmpfsProbe
from sandbox.errors import Unavailable
from sandbox.limits import ResolvedLimits
from sandbox.protocol import ProtocolViolation

__all__ = ["DockerSandbox", "remove_container", "spawn_container"]

END_FRAME_GRACE_S = 1.0
# Engine waits block a thread for as long as a script runs: keep them out of the default
# executor, whose few threads the engine calls that start and remove containers need.
_WAITERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="ptc-docker-wait")
READY_TIMEOUT_S = 30.0
LOG_TAIL_BYTES = 2000


def _signed(code: int) -> int:
    """docker-init reports a child killed by signal N as 128 + N; the seam wants -N."""
    return -(code - 128) if 128 < code < 128 + 65 else code


@dataclass(frozen=True)
class Fate:
    exit_code: int
    oom_killed: bool


class DockerSandbox:
    """A started, ready container; see `sandbox.backends.base.SandboxHandle`."""

    def __init__(
        self,
        container: Container,
        settings: ContainerSettings,
        sockets: HostSockets,
        connected: Connected,
        pid: int,
        reap: Callable[[DockerSandbox], None],
    ) -> None:
        self.container = container
        self.settings = settings
        self.channel = connected.channel
        self.stdout = connected.stdout
        self.stderr = connected.stderr
        self._transports = connected.transports
        self._sockets = sockets
        self._reap = reap
        self.cgroup = ContainerCgroup.locate(pid, container.id or "") if pid > 0 else None
        self.capabilities = container_capabilities(settings.oci_runtime, self.cgroup is not None)
        self.isolation = isolation_layers(settings, self.cgroup is not None)
        self._counters = CgroupCounters()
        self._sampled = False
        # Sampled from three threads: the loop's, the channel's (`on_end`) and the OOM watch's.
        self._sampling = threading.Lock()
        # The container's /tmp and /dev/shm, measured at the end (a full one corroborates a
        # write the file size limit refused); only where the engine runs on this host.
        self._tmpfs = TmpfsProbe.open(pid) if self.cgroup is not None else TmpfsProbe({})
        self._pidfd = -1
        self._exited: asyncio.Future[None] | None = None
        if self.cgroup is not None:
            self._watch_exit(pid)
        self.channel.on_end = self._sample  # on the channel thread, while the guest still lives
        self._engine_fate: asyncio.Future[Fate] | None = None
        self._exit_task: asyncio.Future[int] | None = None
        self._end_before_kill = False
        self._exit_code: int | None = None
        self._oom_killed = False
        self._killed = False
        self._disposed = False
        # At the kernel's out-of-memory notice, on the watch's thread: the engine removes the
        # cgroup as soon as the OOM killer's victim has exited, often before the loop sees the
        # exit (`sandbox.backends.docker.oom_watch`).
        self._oom_notifier = self.cgroup.oom_notifier() if self.cgroup is not None else None
        if self._oom_notifier is not None:
            oom_watch().watch(self._oom_notifier, self._sample)

    # -- exit watching ---------------------------------------------------------------------
    def _watch_exit(self, pid: int) -> None:
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            return
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def on_exit() -> None:
            loop.remove_reader(self._pidfd)
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(self._pidfd, on_exit)
        self._exited = exited

    @property
    def alive(self) -> bool:
        """False once the container's init has exited (as far as this host can tell)."""
        if self._exited is not None:
            return not self._exited.done()
        return self._exit_code is None and not self._disposed

    def _engine_wait(self) -> Fate:
        result = self.container.wait()
        self.container.reload()
        state: dict[str, Any] = self.container.attrs.get("State", {})
        code = state.get("ExitCode", result.get("StatusCode", -1))
        return Fate(_signed(int(code)), bool(state.get("OOMKilled")))

    def _fate_from_engine(self) -> asyncio.Future[Fate]:
        if self._engine_fate is None:
            loop = asyncio.get_running_loop()
            self._engine_fate = loop.run_in_executor(_WAITERS, self._engine_wait)
            self._engine_fate.add_done_callback(_retrieve)
        return self._engine_fate

    async def wait(self) -> int:
        if self._exit_code is not None:
            return self._exit_code
        if self._exited is not None:
            await asyncio.shield(self._exited)
            self._sample()
            if self.channel.end_exit_code is None:
                # The end frame came before the exit, but the channel thread may not have read
                # it yet; the stream ends as soon as the container's processes are gone.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.channel.wait_closed(), END_FRAME_GRACE_S)
            reported = self.channel.end_exit_code
            if reported is not None and (self._end_before_kill or not self._killed):
                self._exit_code = _signed(reported)
                return self._exit_code
        try:
            fate = await asyncio.shield(self._fate_from_engine())
        except docker.errors.DockerException as exc:
            raise Unavailable(f"the docker engine lost the sandbox container: {exc}") from exc
        self._oom_killed = fate.oom_killed
        self._exit_code = fate.exit_code
        return fate.exit_code

    def exit_future(self) -> asyncio.Future[int]:
        if self._exit_task is None:
            self._exit_task = asyncio.ensure_future(self.wait())
            self._exit_task.add_done_callback(_retrieve)
        return self._exit_task

    # -- control -----------------------------------------------------------------------------
    async def apply_limits(self, limits: ResolvedLimits) -> None:
        """Nothing to do: the backend only hands out containers created with these limits."""

    async def kill(self) -> None:
        if not self._killed:
            # A guest that reported its end before the kill is past os._exit: its code stands.
            self._end_before_kill = self.channel.end_exit_code is not None
        self._killed = True
        self._sample()
        if self._pidfd >= 0:
            # SIGKILL to the namespace's init takes every process of the container with it.
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            return
        with contextlib.suppress(docker.errors.DockerException):
            await asyncio.to_thread(self.container.kill)

    def _sample(self) -> None:
        with self._sampling:
            if self.cgroup is not None and not self._disposed:
                counters = self.cgroup.read()
                if counters is not None:
                    self._counters = self._counters.then(counters)
                    self._sampled = True

    def usage(self) -> ResourceUsage:
        if self._exit_code is None:
            self._sample()
        counters = self._counters
        return ResourceUsage(
            cpu_time_s=counters.cpu_time_ns / 1e9,
            peak_memory_bytes=counters.memory_peak_bytes,
            oom_killed=self._oom_killed or counters.oom_kills > 0,
            pids_limit_hit=counters.pids_max_events > 0,
            accounted=self._sampled,
            memory_limit_hits=counters.memory_limit_hits,
            pids_limit_hits=counters.pids_max_events,
            peak_pids=counters.pids_peak,
            tmpfs=self._tmpfs.sample(),
        )

    async def dispose(self) -> None:
        if self._disposed:
            return
        self._sample()
        self._disposed = True
        if self._oom_notifier is not None:
            oom_watch().unwatch(self._oom_notifier)
            self._oom_notifier = None
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            if self._exited is not None and not self._exited.done():
                asyncio.get_running_loop().remove_reader(self._pidfd)
                self._exited.cancel()
            os.close(self._pidfd)
            self._pidfd = -1
        if self._exit_task is not None and not self._exit_task.done():
            self._exit_task.cancel()
        await self.channel.close()
        for transport in self._transports:
            transport.close()
        self._sockets.close()
        self._tmpfs.close()
        # The engine call that removes the container runs in the background (the backend
        # awaits it at close), so it is not on the request path.
        self._reap(self)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def remove_container(container: Container) -> None:
    """Force-removes a container and its anonymous volumes; gone already is fine."""
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True, v=True)


def _create_started(client: DockerClient, settings: ContainerSettings) -> tuple[Container, int]:
    container = client.containers.create(**container_kwargs(settings))
    try:
        container.start()
        container.reload()
    except BaseException:
        remove_container(container)
        raise
    state: dict[str, Any] = container.attrs.get("State", {})
    return container, int(state.get("Pid") or 0)


def _logs(container: Container) -> str:
    with contextlib.suppress(docker.errors.DockerException):
        raw = container.logs(stdout=True, stderr=True, tail=20)
        if isinstance(raw, bytes):
            return raw.decode(errors="replace")[-LOG_TAIL_BYTES:].strip()
    return ""


async def spawn_container(
    client: DockerClient,
    settings: ContainerSettings,
    reap: Callable[[DockerSandbox], None],
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> DockerSandbox:
    """Creates and starts one container and waits until its guest is ready for a job."""
    making = asyncio.ensure_future(asyncio.to_thread(HostSockets.create, settings.channel_dir))
    try:
        sockets = await asyncio.shield(making)
    except asyncio.CancelledError:
        # Cancelled (the backend closing) while the thread made them: close what it made.
        with contextlib.suppress(Exception):
            (await making).close()
        raise
    accepting = asyncio.ensure_future(sockets.accept(ready_timeout_s, settings.name))
    # The engine calls run in a thread that a cancellation cannot stop: on any failure the
    # container it made (if any) is removed once the thread is done.
    creating = asyncio.ensure_future(asyncio.to_thread(_create_started, client, settings))
    connected: Connected | None = None
    try:
        try:
            started, pid = await asyncio.shield(creating)
        except docker.errors.DockerException as exc:
            raise Unavailable(f"the docker sandbox did not start: {exc}") from exc
        connected = await accepting
        await connected.channel.ready(ready_timeout_s)
        return DockerSandbox(started, settings, sockets, connected, pid, reap)
    except BaseException as exc:
        accepting.cancel()
        with contextlib.suppress(BaseException):
            await accepting
        if connected is not None:
            await connected.channel.close()
            for transport in connected.transports:
                transport.close()
        sockets.close()
        logs = ""
        container: Container | None = None
        with contextlib.suppress(BaseException):
            container, _pid = await creating
        if container is not None:
            logs = await asyncio.to_thread(_logs, container)
            with contextlib.suppress(docker.errors.DockerException):
                await asyncio.to_thread(remove_container, container)
        if isinstance(exc, (ProtocolViolation, TimeoutError, OSError, ValueError)):
            detail = f"; its output: {logs}" if logs else ""
            raise Unavailable(f"the docker sandbox did not become ready: {exc!r}{detail}") from exc
        raise
