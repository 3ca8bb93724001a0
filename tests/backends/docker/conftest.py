"""A real Docker engine behind a real Engine, for the container backend's tests.

Skipped, with the reason (by tests/conftest.py), when no engine answers (`PTC_DOCKER_HOST` /
`DOCKER_HOST`, see scripts/dockerd.sh) or the runtime image is missing or stale
(scripts/build_images.sh). CI starts both (scripts/ci_docker.sh). `DockerHarness.leftovers()`
asks the engine and the filesystem for anything an execution left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

import pytest

from sandbox.backends.docker import engine_client
from sandbox.backends.docker.backend import DockerBackendConfig
from sandbox.backends.docker.janitor import owner_label
from sandbox.backends.docker.spec import LABEL_MANAGED, LABEL_OWNER
from sandbox.backends.factory import build_backend
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult

T = TypeVar("T")
POOL_SIZE = 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = {
            "docker_harness",
            "dclean",
            "docker_client",
            "oci_harness",
            "oclean",
            "harness_context",
        }
        if fixtures & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.requires_docker)  # tests/conftest.py skips them


class DockerHarness:
    """A started Engine with only the docker backend; its loop runs in a daemon thread."""

    def __init__(
        self,
        pool_size: int = POOL_SIZE,
        backend: Literal["docker", "gvisor"] = "docker",
        **config: Any,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        # ``backend``: "docker", or "gvisor" (the same under the OCI runtime runsc).
        self.backend = build_backend(backend, DockerBackendConfig(pool_size=pool_size, **config))
        name = self.backend.name
        self.engine = Engine(EngineConfig(backends={name: self.backend}, default_backend=name))
        self.call(self.engine.start())
        assert self.backend.unavailable_reason is None, self.backend.unavailable_reason
        self.call(self.backend.pool.wait_ready(60))
        self.client = engine_client.connect(self.backend.address)
        self.owner = owner_label(self.backend.owner)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 110) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def run(
        self, script: str, limits: Mapping[str, object] | None = None, manifest: Any = "[]"
    ) -> ExecutionResult:
        request = ExecutionRequest(
            script=script,
            manifest=manifest,
            limits=parse_limit_args(f"{k}={v}" for k, v in (limits or {}).items()),
            backend=self.backend.name,
        )
        return self.call(self.engine.execute(request))

    def assert_healthy(self) -> None:
        result = self.run("print('still ok')")
        assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "still ok\n")

    def our_containers(self) -> list[Any]:
        return self.client.containers.list(
            all=True, filters={"label": f"{LABEL_OWNER}={self.owner}"}, ignore_removed=True
        )

    def settle(self) -> None:
        async def _wait() -> None:
            pool = self.backend.pool
            for _ in range(3000):
                if pool.settled and not self.backend._removals:
                    return
                await asyncio.sleep(0.01)

        self.call(_wait())

    def leftovers(self) -> list[str]:
        """Containers and channel directories that no idle pooled sandbox owns."""
        self.settle()
        idle = list(self.backend.pool._idle)
        idle_ids = {h.container.id for h in idle}
        problems = [
            f"container {c.name} ({c.status})"
            for c in self.our_containers()
            if c.id not in idle_ids
        ]
        idle_dirs = {h.settings.channel_dir for h in idle}
        owner_dir = self.backend._owner_dir
        problems += [f"channel dir {p}" for p in owner_dir.iterdir() if p not in idle_dirs]
        return problems

    def close(self) -> None:
        self.call(self.engine.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        self.client.close()


def _checked_harness(**config: Any) -> Iterator[DockerHarness]:
    """A harness; after its engine closed, no container or channel directory of it is left."""
    h = DockerHarness(**config)
    yield h
    owner_dir = h.backend._owner_dir
    client = engine_client.connect(h.backend.address)
    h.close()
    try:
        left = client.containers.list(
            all=True, filters={"label": f"{LABEL_OWNER}={h.owner}"}, ignore_removed=True
        )
        assert left == [], f"containers survived Engine.close(): {[c.name for c in left]}"
        assert not owner_dir.exists(), "the channel directory survived Engine.close()"
        managed = client.containers.list(
            all=True, filters={"label": LABEL_MANAGED}, ignore_removed=True
        )
        assert all(c.labels.get(LABEL_OWNER) != h.owner for c in managed)
    finally:
        client.close()


@pytest.fixture(scope="module")
def docker_harness() -> Iterator[DockerHarness]:
    yield from _checked_harness()


@pytest.fixture(
    scope="module",
    params=["runc", pytest.param("runsc", marks=pytest.mark.requires_gvisor)],
)
def oci_harness(request: pytest.FixtureRequest) -> Iterator[DockerHarness]:
    """The Docker backend under each OCI runtime: runc, then runsc (gVisor, as backend
    ``gvisor``); `harness.backend.name` says which, for the rows where they differ."""
    if request.param == "runsc":
        yield from _checked_harness(backend="gvisor")
    else:
        yield from _checked_harness()


@pytest.fixture
def harness_context() -> Callable[..., contextlib.AbstractContextManager[DockerHarness]]:
    """A checked harness started and closed where the test says, for tests that look at the
    host before the engine starts its first container and after it removed its last."""
    return contextlib.contextmanager(_checked_harness)


@pytest.fixture
def docker_client() -> Iterator[Any]:
    """A plain SDK client of the engine the tests use."""
    client = engine_client.connect(engine_client.engine_address())
    yield client
    client.close()


@pytest.fixture
def dclean(docker_harness: DockerHarness) -> Iterator[DockerHarness]:
    """The shared harness, checked for leftover containers and directories after the test."""
    yield docker_harness
    assert docker_harness.leftovers() == []


@pytest.fixture
def oclean(oci_harness: DockerHarness) -> Iterator[DockerHarness]:
    """`oci_harness`, checked for leftover containers and directories after the test."""
    yield oci_harness
    assert oci_harness.leftovers() == []
