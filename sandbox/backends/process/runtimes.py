"""The process backend's runtimes: one zygote and one warm pool per runtime in use.

A runtime (`sandbox.runtimes`) is a read-only tree that its zygote binds at /ptc-runtime; the
zygote adds the tree's ``site`` to sys.path and imports the runtime's ``preload`` modules once,
so each sandbox it forks has them without paying for the import. Zygotes start on a runtime's
first use. A runtime removed and built again under the same name is a new directory: the old
zygote and pool are retired on the next request, which then gets the new build.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from sandbox.backends.pool import WarmPool
from sandbox.backends.process.sandbox import ProcessSandbox
from sandbox.backends.process.zygote import ZygoteSettings, ZygoteSupervisor
from sandbox.errors import Unavailable
from sandbox.runtimes import Runtime, RuntimeStore, guest_python_version

__all__ = ["RuntimeEnv", "RuntimeEnvs"]

# The backend's pool for one runtime's zygote (under the backend's `max_sandboxes`).
PoolMaker = Callable[[ZygoteSupervisor, str], WarmPool[ProcessSandbox]]


@dataclass
class RuntimeEnv:
    """One runtime's zygote and pool."""

    runtime: Runtime
    identity: tuple[int, int]  # the tree's (device, inode): a rebuild is a new directory
    zygote: ZygoteSupervisor
    pool: WarmPool[ProcessSandbox]

    async def close(self) -> None:
        await self.pool.close()
        await asyncio.to_thread(self.zygote.close)


def _identity(runtime: Runtime) -> tuple[int, int]:
    stat = os.stat(runtime.path)
    return (stat.st_dev, stat.st_ino)


class RuntimeEnvs:
    """The backend's runtimes, by name; started on first use."""

    def __init__(
        self,
        store: RuntimeStore,
        python: str,
        base: ZygoteSettings,
        make_pool: PoolMaker,
    ) -> None:
        self.store = store
        self.python = python
        self.base = base
        self._make_pool = make_pool
        self.envs: dict[str, RuntimeEnv] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._retired: set[asyncio.Task[None]] = set()

    @functools.cached_property
    def python_version(self) -> str:
        return guest_python_version(self.python)

    def check(self, name: str) -> Runtime:
        """The runtime, usable by this backend's interpreter; `NotFound` or `InvalidArgument`
        (a bad name, another Python, unreadable) otherwise. Cheap: no sandbox is involved."""
        return self.store.check_for(name, self.python_version)

    async def env(self, name: str) -> RuntimeEnv:
        """The runtime's zygote and pool, started now if this is its first use."""
        runtime = await asyncio.to_thread(self.check, name)
        identity = _identity(runtime)
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            env = self.envs.get(name)
            if env is not None and env.identity == identity:
                return env
            if env is not None:  # rebuilt since: retire the old build's zygote and pool
                del self.envs[name]
                task = asyncio.create_task(env.close())
                self._retired.add(task)
                task.add_done_callback(self._retired.discard)
            settings = replace(self.base, runtime_tree=runtime.path, preload=runtime.preload)
            zygote = ZygoteSupervisor(settings)
            try:
                await asyncio.to_thread(zygote.start)
            except Unavailable as exc:
                await asyncio.to_thread(zygote.close)
                raise Unavailable(f"runtime {name!r}: {exc.message}") from exc
            pool = self._make_pool(zygote, name)
            pool.start()
            env = self.envs[name] = RuntimeEnv(runtime, identity, zygote, pool)
            return env

    def zygote_pids(self) -> list[int]:
        return [pid for env in self.envs.values() for pid in env.zygote.pids()]

    async def close(self) -> None:
        envs, self.envs = list(self.envs.values()), {}
        for env in envs:
            with contextlib.suppress(Exception):
                await env.close()
        while self._retired:
            await asyncio.gather(*list(self._retired), return_exceptions=True)
