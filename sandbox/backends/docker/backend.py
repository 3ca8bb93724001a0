"""The Docker backend: single-use containers from a warm pool, on a Docker engine.

`DockerBackend()` needs no arguments: the engine address comes from `PTC_DOCKER_HOST` or
`DOCKER_HOST`, the image from `PTC_DOCKER_IMAGE` (default `ptc-sandbox-runtime:latest`, built by
`scripts/build_images.sh`). A server starts without Docker: when no engine answers or the image
is missing or stale, `start` logs why and every `acquire` raises `sandbox.errors.Unavailable`
with that reason (re-checking the engine at most every `retry_after_s`).

Pool containers are created with the pool's limits (memory, processes, tmp size); a job whose
limits differ gets a container created for it on demand, so the engine enforces exactly the
effective limits. The engine calls of the SDK are synchronous: they run in threads, and none is
on the path of a warm execution (see `container`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.errors import Unavailable

try:
    from docker import DockerClient
except ImportError as exc:  # the SDK is an optional extra; say which one
    raise Unavailable(
        "the Docker backend needs the Docker SDK, which is not installed: "
        "pip install 'ptc-sandbox[docker]'"
        f" ({type(exc).__name__}: {exc})"
    ) from exc

from sandbox.backends.base import Capabilities, SandboxHandle
from sandbox.backends.docker import engine_client, janitor
from sandbox.backends.docker.container import DockerSandbox, remove_container, spawn_container
from sandbox.backends.docker.spec import ContainerSettings, container_capabilities
from sandbox.backends.pool import WarmPool
from sandbox.limits import DEFAULTS, ResolvedLimits

__all__ = ["DockerBackend", "DockerBackendConfig", "default_runtime_root"]

log = logging.getLogger(__name__)
REMOVE_ATTEMPTS = 5
SANDBOX_UID = 65532


def default_runtime_root() -> Path:
    """Where channel directories live: on the engine's host, readable by the sandbox uid."""
    configured = os.environ.get("PTC_DOCKER_RUNTIME_DIR")
    if configured:
        return Path(configured)
    if os.getuid() == 0:
        return Path("/run/ptc-sandbox-channels")
    return Path(tempfile.gettempdir()) / f"ptc-sandbox-channels-{os.getuid()}"


@dataclass(frozen=True)
class DockerBackendConfig:
    address: str | None = None  # default: PTC_DOCKER_HOST, DOCKER_HOST, the local socket
    image: str | None = None  # default: PTC_DOCKER_IMAGE, else DEFAULT_IMAGE
    pool_size: int = 2
    max_starting: int = 2
    pool_limits: ResolvedLimits = DEFAULTS  # what pool containers are created with
    runtime_root: Path | None = None
    user: str = f"{SANDBOX_UID}:{SANDBOX_UID}"
    python: str = "python3"
    retry_after_s: float = 10.0
    # A refill starts this long after a container is taken: starting a container keeps both of
    # a small machine's cores busy for ~0.3 s, and most scripts are done before this delay.
    refill_delay_s: float = 0.05
    labels: dict[str, str] = field(default_factory=dict)
    # The engine's OCI runtime for every container: "runc", or "runsc" for gVisor (registered
    # with the engine: scripts/dockerd.sh). ``name`` is what requests and tenants call this
    # backend ("gvisor" for a runsc one next to a runc "docker" one in the same server).
    oci_runtime: str = "runc"
    name: str = "docker"
    # Runtimes (`sandbox.runtimes`) run in images built on ``image`` (`ptc runtime image`).
    runtimes_dir: str | None = None


_Key = tuple[int, int, int]


def _key(limits: ResolvedLimits) -> _Key:
    return (limits.memory_bytes, limits.processes, limits.file_size_bytes)


class DockerBackend:
    name = "docker"

    def __init__(self, config: DockerBackendConfig | None = None) -> None:
        self.config = config or DockerBackendConfig()
        self.name = self.config.name
        self.address = self.config.address or engine_client.engine_address()
        self.image = self.config.image or engine_client.default_image()
        self.runtime_root = self.config.runtime_root or default_runtime_root()
        if self.name != "docker":  # its own channel directories and janitor sweep
            self.runtime_root = self.runtime_root / self.name
        self.owner = janitor.this_owner()
        self.unavailable_reason: str | None = "the docker backend is not started"
        self._client: DockerClient | None = None
        self._pool: WarmPool[DockerSandbox] | None = None
        self._owner_dir = self.runtime_root / janitor.owner_dir_name(self.owner)
        self._names = itertools.count(1)
        self._removals: set[asyncio.Task[None]] = set()
        self._last_attempt = 0.0
        self._connecting: asyncio.Lock | None = None
        self._closed = False
        self._runtime_images: dict[str, str] = {}  # runtime name -> its checked image tag

    # -- start-up ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connects and fills the pool; without an engine, records why instead of failing."""
        self._connecting = asyncio.Lock()
        await self._try_connect()

    async def _try_connect(self) -> None:
        assert self._connecting is not None
        async with self._connecting:
            if self._pool is not None or self._closed:
                return
            self._last_attempt = time.monotonic()
            try:
                await self._connect()
            except Unavailable as exc:
                self.unavailable_reason = exc.message
                log.warning("%s", exc.message)

    async def _connect(self) -> None:
        client = await asyncio.to_thread(engine_client.connect, self.address)
        try:
            await asyncio.to_thread(engine_client.check_image, client, self.image)
            await asyncio.to_thread(engine_client.check_runtime, client, self.config.oci_runtime)
            await asyncio.to_thread(janitor.clean_leftovers, client, self.runtime_root)
            await asyncio.to_thread(self._make_owner_dir)
        except BaseException:
            client.close()
            raise
        self._client = client
        self.unavailable_reason = None
        self._pool = WarmPool(
            factory=self._refill_one,
            dispose=lambda h: h.dispose(),
            alive=lambda h: h.alive,
            size=self.config.pool_size,
            max_starting=self.config.max_starting,
        )
        self._pool.start()

    def _make_owner_dir(self) -> None:
        try:
            self.runtime_root.mkdir(mode=0o755, parents=True, exist_ok=True)
            self._owner_dir.mkdir(mode=0o755, exist_ok=True)
            self._owner_dir.chmod(0o755)
        except OSError as exc:
            raise Unavailable(
                f"docker backend unavailable: cannot create {self._owner_dir}: {exc}"
            ) from exc

    # -- sandboxes -----------------------------------------------------------------------------
    async def _refill_one(self, demand: bool) -> DockerSandbox:
        # The Docker backend has no `max_sandboxes` (the engine's own limits apply): a start
        # for demand and a refill differ only in this delay.
        # Delayed only while another container is still waiting: an empty pool refills at once.
        if not demand and self._pool is not None and self._pool.idle > 0:
            await asyncio.sleep(self.config.refill_delay_s)
        return await self._spawn(self.config.pool_limits)

    async def _spawn(
        self, limits: ResolvedLimits, image: str | None = None, runtime: str | None = None
    ) -> DockerSandbox:
        if self._client is None:
            raise Unavailable(self.unavailable_reason or "the docker backend is not started")
        n = next(self._names)
        prefix = "ptc" if self.name == "docker" else f"ptc-{self.name}"
        settings = ContainerSettings(
            image=image or self.image,
            name=f"{prefix}-{self.owner[1]}-{self.owner[2]}-{n}",
            owner=janitor.owner_label(self.owner),
            channel_dir=self._owner_dir / f"c{n}",
            memory_bytes=limits.memory_bytes,
            processes=limits.processes,
            tmp_bytes=limits.file_size_bytes,
            user=self.config.user,
            python=self.config.python,
            oci_runtime=self.config.oci_runtime,
            backend=self.name,
        )
        sandbox = await spawn_container(self._client, settings, self._reap)
        if runtime is not None:
            sandbox.isolation.append(f"runtime:{runtime}")
        return sandbox

    def _reap(self, sandbox: DockerSandbox) -> None:
        task = asyncio.create_task(self._remove(sandbox))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _remove(self, sandbox: DockerSandbox) -> None:
        # A busy engine can refuse or time out a removal (409 "already in progress", read
        # timeouts): retry a few times, and `close()` sweeps whatever still carries our label.
        for attempt in range(REMOVE_ATTEMPTS):
            try:
                await asyncio.to_thread(remove_container, sandbox.container)
                return
            except Exception as exc:
                if attempt == REMOVE_ATTEMPTS - 1:
                    log.warning(
                        "docker backend: removing %s failed: %s", sandbox.container.name, exc
                    )
                    return
                await asyncio.sleep(0.2 * (attempt + 1))

    @property
    def capacity(self) -> None:
        return None  # the engine's own resources bound its containers, not max_sandboxes

    @property
    def pool(self) -> WarmPool[DockerSandbox]:
        if self._pool is None:
            raise Unavailable(self.unavailable_reason or "the docker backend is not started")
        return self._pool

    @property
    def capabilities(self) -> Capabilities:
        """Its containers' under its OCI runtime, where the host can read their cgroups (a
        container's own says whether it could)."""
        return container_capabilities(self.config.oci_runtime, cgroup_readable=True)

    def check_runtime(self, name: str) -> str:
        """The image of runtime ``name`` (built on this backend's image); NotFound when it is
        missing or stale, before any container is taken."""
        from sandbox.runtimes import RuntimeStore
        from sandbox.runtimes.docker_image import image_tag, usable_image

        runtime = RuntimeStore(self.config.runtimes_dir).get(name)
        tag = image_tag(runtime)
        if self._runtime_images.get(name) == tag:
            return tag
        if self._client is None:
            raise Unavailable(self.unavailable_reason or "the docker backend is not started")
        tag = usable_image(self._client, runtime, self.image)
        self._runtime_images[name] = tag
        return tag

    async def acquire(self, limits: ResolvedLimits, runtime: str | None = None) -> SandboxHandle:
        if runtime is not None and runtime != "default":
            # One container per execution from the runtime's image, started on demand.
            image = await asyncio.to_thread(self.check_runtime, runtime)
            return await self._spawn(limits, image, runtime)
        due = time.monotonic() - self._last_attempt >= self.config.retry_after_s
        if self._pool is None and self._connecting is not None and not self._closed and due:
            await self._try_connect()
        pool = self.pool
        if _key(limits) == _key(self.config.pool_limits):
            return await pool.acquire()
        return await self._spawn(limits)

    def isolation(self) -> list[str]:
        layers = ["container", "netns:none", "caps:none", "seccomp:ptc", "fs:readonly-root"]
        return [*layers, f"oci-runtime:{self.config.oci_runtime}"]

    async def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        while self._removals:
            await asyncio.gather(*list(self._removals), return_exceptions=True)
        if self._client is not None:
            await asyncio.to_thread(janitor.remove_owned, self._client, self.owner, self.name)
            self._client.close()
            self._client = None
        shutil.rmtree(self._owner_dir, ignore_errors=True)
