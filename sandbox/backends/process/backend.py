"""The process backend: sandboxes forked from a zygote into a warm pool, limited by rlimits and
cgroups.

At start it checks what this host can enforce (bwrap and user namespaces, cgroups, the seccomp
filter) and fails closed: without cgroups or the filter it refuses to start unless configured
with `allow_degraded`, and every result names the isolation layers that were in force.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandbox.backends.base import Capabilities, SandboxHandle
from sandbox.backends.capacity import Capacity
from sandbox.backends.pool import WarmPool
from sandbox.backends.process import pidfd
from sandbox.backends.process.bwrap import probe_bwrap
from sandbox.backends.process.cgroups import CgroupManager
from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.releaser import Releaser
from sandbox.backends.process.runtime_dir import make_runtime_dir, sweep_stale_runtime_dirs
from sandbox.backends.process.runtimes import RuntimeEnvs
from sandbox.backends.process.sandbox import ProcessSandbox, process_capabilities, spawn_sandbox
from sandbox.backends.process.seccomp import unavailable_reason as seccomp_unavailable_reason
from sandbox.backends.process.start import SpawnSettings
from sandbox.backends.process.uid_claims import UidClaims, counts_per_namespace
from sandbox.backends.process.uid_range import DEFAULT_COUNT, DEFAULT_FIRST, UidPool, find_range
from sandbox.backends.process.zygote import ZygoteSettings, ZygoteSupervisor
from sandbox.errors import Unavailable
from sandbox.guest import fork_loop_library
from sandbox.limits import DEFAULTS, ResolvedLimits
from sandbox.runtimes import DEFAULT_RUNTIME, Runtime, RuntimeStore

__all__ = ["ProcessBackend", "ProcessBackendConfig", "default_guest_python"]

NOBODY = 65534
# A SIGKILLed pid 1 is gone within milliseconds; a drain that waits longer says which are not.
EXIT_AFTER_KILL_WAIT_S = 10.0
log = logging.getLogger(__name__)


def default_guest_python() -> str:
    """Debian's interpreter when present: readable by any uid, and a faster PGO build."""
    for candidate in ("/usr/bin/python3",):
        if os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return os.path.realpath(sys.executable)


@dataclass(frozen=True)
class ProcessBackendConfig:
    python: str | None = None
    pool_size: int = 2  # sandboxes kept warm when quiet
    pool_max_idle: int = 8  # kept warm at most, while demand outruns the pool
    # Sandboxes starting at once (0: two per CPU). A start through the fork server is a few
    # ms of CPU, most of it the sandbox's own set-up; with 2 at a time on 2 cores the starts,
    # not the CPU, bounded sustained throughput (`bench.forkserver`).
    pool_max_starting: int = 0
    max_sandboxes: int = 64  # alive at once (idle and running); more wait for one to end
    uid: int = NOBODY  # the zygote's, and every sandbox's where they cannot have their own
    gid: int = NOBODY
    # One uid per sandbox (`uid_range`): the first uid (and gid) of the range and how many, used
    # where the server is root in its user namespace with all of them mapped and none is an
    # account's; elsewhere, or with a count of 0, every sandbox runs as ``uid`` (the isolation
    # says limit:processes=rlimit-shared without a cgroup).
    sandbox_uid_first: int = DEFAULT_FIRST
    sandbox_uid_count: int = DEFAULT_COUNT
    # The limits pooled sandboxes are started with; a job with another file_size (which sizes
    # the private tmp) gets a sandbox started on demand.
    pool_limits: ResolvedLimits = DEFAULTS
    allow_degraded: bool = False
    # False: use no cgroups even where they are writable, as the degraded mode does where they
    # are not (rlimits and the host's own accounting); needs allow_degraded. For the tests and
    # benchmarks of that mode on a host that has cgroups.
    cgroups: bool = True
    # Without cgroups: the host sums each sandbox's processes from /proc and stops it at its
    # memory or CPU limit (`host_meter`); False leaves per-process rlimits alone (the
    # benchmark's baseline, `bench.host_accounting`).
    host_accounting: bool = True
    # The zygote is replaced after this many forks or seconds (children share its address
    # layout and hash seed; see SECURITY.md).
    zygote_max_forks: int = 2000
    zygote_max_age_s: float = 600.0
    # Runtimes (`sandbox.runtimes`): where they are (None: `default_runtimes_dir()`), and the
    # sandboxes kept warm per runtime in use (each runtime has its own zygote).
    runtimes_dir: str | None = None
    runtime_pool_size: int = 1
    runtime_pool_max_idle: int = 4
    # How a sandbox's exit status reaches the host: "pidfd" (Linux 6.15+: no process beside
    # each sandbox), "reaper" (a reaper process per sandbox, any kernel), "auto" (pidfd where
    # the kernel supports it).
    exit_status: Literal["auto", "pidfd", "reaper"] = "auto"
    # The zygote forks from its loop in C (`sandbox/guest/forkloop.c`: about 0.2 ms less
    # machine CPU per sandbox) where the package was built with it; False: its Python loop.
    native_fork_loop: bool = True


class ProcessBackend:
    name = "process"

    def __init__(self, config: ProcessBackendConfig | None = None) -> None:
        self.config = config or ProcessBackendConfig()
        self.python = self.config.python or default_guest_python()
        self.cgroups: CgroupManager | None = None
        self._runtime_dir: Path | None = None
        self._pool: WarmPool[ProcessSandbox] | None = None
        self._names = itertools.count(1)
        self._isolation: list[str] = []
        self._releaser = Releaser()
        self._exiting: set[ProcessSandbox] = set()  # disposed of, not yet released
        self._seccomp = False
        self.zygote: ZygoteSupervisor | None = None
        self.capacity = Capacity(self.config.max_sandboxes)
        self.runtimes: RuntimeEnvs | None = None
        # Without cgroups: the OOM kills of the cgroup the server runs in (`enclosing_oom`).
        self._enclosing_oom: EnclosingOomCounter | None = None
        self.uids: UidPool | None = None  # one uid per sandbox, where the host has a range

    async def start(self) -> None:
        reason = await asyncio.to_thread(probe_bwrap, self.python, self.config.uid, self.config.gid)
        if reason is not None:
            raise Unavailable(f"process backend unavailable: {reason}")
        await self._take_cgroups()
        why_no_seccomp = await asyncio.to_thread(seccomp_unavailable_reason)
        if why_no_seccomp is not None and not self.config.allow_degraded:
            raise Unavailable(
                f"process backend refuses to run without its syscall filter ({why_no_seccomp}); "
                "configure allow_degraded to run without it"
            )
        self._seccomp = why_no_seccomp is None
        self._take_uids()
        sweep_stale_runtime_dirs()
        self._runtime_dir = make_runtime_dir(self.config.native_fork_loop)
        if self.config.native_fork_loop and fork_loop_library() is None:
            log.info(
                "the zygote forks from Python (about 0.2 ms more CPU per sandbox): this "
                "installation has no native fork loop (no C compiler when it was installed)"
            )
        self.zygote = ZygoteSupervisor(
            ZygoteSettings(
                python=self.python,
                runtime_dir=self._runtime_dir,
                uid=self.config.uid,
                gid=self.config.gid,
                seccomp=self._seccomp,
                max_forks=self.config.zygote_max_forks,
                max_age_s=self.config.zygote_max_age_s,
                exit_status=await self._exit_status_mode(),
                sandbox_uids=self.uids.range if self.uids is not None else None,
            )
        )
        self.runtimes = RuntimeEnvs(
            RuntimeStore(self.config.runtimes_dir),
            self.python,
            self.zygote.settings,
            self._runtime_pool,
        )
        try:
            await asyncio.to_thread(self.zygote.start)
            await asyncio.to_thread(lambda: self.runtimes and self.runtimes.python_version)
        except BaseException:
            await self.close()
            raise
        self._pool = self._new_pool(
            lambda demand: self._spawn(self.config.pool_limits, demand=demand),
            self.config.pool_size,
            self.config.pool_max_idle,
        )
        self._pool.start()

    async def _take_cgroups(self) -> None:
        """A cgroup per sandbox where the host delegates them; without, only when degraded mode
        is allowed, and then the OOM kills of the cgroup the server runs in are watched."""
        self.cgroups = CgroupManager.detect() if self.config.cgroups else None
        if self.cgroups is not None:
            self.cgroups.cleanup_stale()
            return
        why = (
            CgroupManager.unavailable_reason() or "unknown reason"
            if self.config.cgroups
            else "cgroups turned off in the backend's configuration"
        )
        if not self.config.allow_degraded:
            raise Unavailable(
                "process backend refuses to run without cgroup limits "
                f"({why}); configure allow_degraded to run with rlimits only"
            )
        self._enclosing_oom = await asyncio.to_thread(EnclosingOomCounter.find)

    def _take_uids(self) -> None:
        """A uid per sandbox where the host has a range to give (`uid_range`); else one for
        all, said once in the log and in every result's isolation."""
        config = self.config
        found = find_range(
            config.sandbox_uid_first, config.sandbox_uid_count, config.uid, config.gid
        )
        if isinstance(found, str):
            log.info("every process sandbox runs as uid %d: %s", config.uid, found)
            return
        claims = UidClaims.open()  # shared with this host's other backends (`uid_claims`)
        if isinstance(claims, str):
            log.warning("every process sandbox runs as uid %d: %s", config.uid, claims)
            return
        self.uids = UidPool(found, claims)
        release = os.uname().release
        if not counts_per_namespace(release):
            log.warning(
                "sandbox uids %d-%d: Linux %s counts a uid's processes host-wide (before 5.14):"
                " a server in another container giving the same uids shares RLIMIT_NPROC with"
                " this one; give each its own range (sandbox_uid_first)",
                config.sandbox_uid_first,
                config.sandbox_uid_first + config.sandbox_uid_count - 1,
                release,
            )

    def _new_pool(
        self, factory: Callable[[bool], Awaitable[ProcessSandbox]], size: int, max_idle: int
    ) -> WarmPool[ProcessSandbox]:
        """A warm pool under this backend's `max_sandboxes`: it never keeps more warm than
        that, and its idle sandboxes give their rooms up to executions that wait for one."""
        limit = self.capacity.limit
        pool = WarmPool(
            factory=factory,
            dispose=lambda h: h.dispose(),
            alive=lambda h: h.alive,
            size=min(size, limit),
            max_idle=min(max_idle, limit),
            max_starting=self.config.pool_max_starting or 2 * (os.cpu_count() or 1),
            room_wanted=self.capacity.wants_room,
        )
        self.capacity.add_pool(pool)
        return pool

    def _runtime_pool(self, zygote: ZygoteSupervisor, runtime: str) -> WarmPool[ProcessSandbox]:
        return self._new_pool(
            lambda demand: self._spawn(self.config.pool_limits, zygote, runtime, demand=demand),
            self.config.runtime_pool_size,
            self.config.runtime_pool_max_idle,
        )

    async def _exit_status_mode(self) -> Literal["pidfd", "reaper"]:
        wanted = self.config.exit_status
        supported = await asyncio.to_thread(pidfd.exit_status_supported)
        if wanted == "pidfd" and not supported:
            raise Unavailable(
                "exit_status 'pidfd' needs a kernel that reports exit statuses through pidfds "
                f"(Linux 6.15 or newer; this is {os.uname().release}): use 'reaper' or 'auto'"
            )
        if wanted == "auto":
            return "pidfd" if supported else "reaper"
        return wanted

    async def _spawn(
        self,
        limits: ResolvedLimits,
        zygote: ZygoteSupervisor | None = None,
        runtime: str | None = None,
        *,
        demand: bool = True,
    ) -> ProcessSandbox:
        """One sandbox under `max_sandboxes`: a start for ``demand`` waits for a room, a pool's
        refill raises `AtCapacity` when none is free (`sandbox.backends.capacity`)."""
        assert self.zygote is not None
        if demand:
            await self.capacity.take()
        else:
            self.capacity.take_speculative()
        try:
            sandbox = await self._fork(limits, zygote, runtime)
        except BaseException:
            self.capacity.give_back()
            raise
        sandbox.on_disposed = functools.partial(self._disposed, sandbox)
        return sandbox

    def _disposed(self, sandbox: ProcessSandbox) -> None:
        """Its room is free at once; until it is released (at pid 1's exit, which disposal
        no longer waits for) a drain or close waits for it."""
        self.capacity.give_back()
        if not sandbox.released.done():
            self._exiting.add(sandbox)
            sandbox.released.add_done_callback(lambda _: self._exiting.discard(sandbox))

    async def _fork(
        self,
        limits: ResolvedLimits,
        zygote: ZygoteSupervisor | None = None,
        runtime: str | None = None,
    ) -> ProcessSandbox:
        assert self.zygote is not None
        uids = self.uids
        sandbox_uid = uids.take() if uids is not None else None
        settings = SpawnSettings(
            tmp_bytes=limits.file_size_bytes,
            uid=self.config.uid,
            limits=limits,
            seccomp=self._seccomp,
            host_accounting=self.config.host_accounting,
            oom_counter=self._enclosing_oom,
            sandbox_uid=sandbox_uid,
        )
        name = f"sb{next(self._names)}"
        try:
            sandbox = await spawn_sandbox(
                zygote or self.zygote, settings, self.cgroups, name, self._reap
            )
        except BaseException:
            if uids is not None and sandbox_uid is not None:
                uids.give_back(sandbox_uid, gone=False)  # its child may live on: quarantine
            raise
        if uids is not None and sandbox_uid is not None:
            # Back to the pool only once pid 1's exit status is read (`uid_range` says why).
            sandbox.exit_future().add_done_callback(
                lambda _: uids.give_back(sandbox_uid, sandbox.exit_seen)
            )
        if not self._isolation:
            self._isolation = list(sandbox.isolation)
        if runtime is not None:
            sandbox.isolation.append(f"runtime:{runtime}")
        return sandbox

    def _reap(self, sandbox: ProcessSandbox) -> None:
        # At pid 1's exit its cgroup is empty: removed here, on the loop, as a rule. One the
        # kernel still finds busy goes to the releasing thread, which retries off the loop.
        if sandbox.cgroup is not None and sandbox.cgroup.try_remove():
            return
        self._releaser.release(sandbox.release_leftovers)

    async def drain(self) -> None:
        """Waits until every finished sandbox has exited and its cgroup is removed."""
        if self._exiting:
            exiting = {s.released: s for s in self._exiting}
            _, late = await asyncio.wait(exiting, timeout=EXIT_AFTER_KILL_WAIT_S)
            if late:
                log.warning(
                    "%d killed sandboxes had not exited after %.0f s (pids %s)",
                    len(late),
                    EXIT_AFTER_KILL_WAIT_S,
                    ", ".join(str(exiting[f].pid) for f in late),
                )
        await self._releaser.drain()

    @property
    def pool(self) -> WarmPool[ProcessSandbox]:
        if self._pool is None:
            raise Unavailable("the process backend is not started")
        return self._pool

    @property
    def capabilities(self) -> Capabilities:
        """Its sandboxes' (`process_capabilities`): cgroups where the host has them, which a
        started backend knows (before `start`: none)."""
        return process_capabilities(self.cgroups is not None, self.config.host_accounting)

    def check_runtime(self, name: str) -> Runtime:
        """Raises a clear error when runtime ``name`` cannot run here (before any sandbox)."""
        if self.runtimes is None:
            raise Unavailable("the process backend is not started")
        return self.runtimes.check(name)

    async def acquire(self, limits: ResolvedLimits, runtime: str | None = None) -> SandboxHandle:
        if runtime is not None and runtime != DEFAULT_RUNTIME:
            if self.runtimes is None:
                raise Unavailable("the process backend is not started")
            env = await self.runtimes.env(runtime)
            if limits.file_size_bytes == self.config.pool_limits.file_size_bytes:
                return await env.pool.acquire()
            return await self._spawn(limits, env.zygote, runtime)
        if limits.file_size_bytes == self.config.pool_limits.file_size_bytes:
            return await self.pool.acquire()
        # The private tmp is sized when the sandbox starts: other sizes start on demand.
        return await self._spawn(limits)

    def isolation(self) -> list[str]:
        return list(self._isolation)

    async def close(self) -> None:
        self.capacity.close()  # starts still waiting for a room fail now, not after the pools
        if self._pool is not None:
            await self._pool.close()
        if self.runtimes is not None:
            await self.runtimes.close()
        await self.drain()
        await asyncio.to_thread(self._releaser.close)
        if self.zygote is not None:
            await asyncio.to_thread(self.zygote.close)
        if self.cgroups is not None:
            self.cgroups.close()
        if self.uids is not None:
            self.uids.close()
        if self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)
            self._runtime_dir = None
