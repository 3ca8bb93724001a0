"""A real gRPC server on an ephemeral loopback port, with the real process backend.

`ServerHarness` runs a `SandboxServer` on its own event loop in a daemon thread, one per test
module (only one process backend may be open per process at a time). Tests talk to it over real
gRPC through the client SDK (`Client`, or `AsyncClient` inside `harness.call`). At teardown the
server is stopped and the module asserts that nothing it started survived: no child processes,
no runtime directory.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.client import AsyncClient, Client
from sandbox.server import SandboxServer, ServerConfig

T = TypeVar("T")
POOL_SIZE = 6
HOST_HANDLERS = {
    "add": "tests.server.ptc_test_host_tools:add",
    "slow": "tests.server.ptc_test_host_tools:slow",
    "broken": "tests.server.ptc_test_host_tools:broken",
}


class ServerHarness:
    def __init__(self, **config: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="server", daemon=True)
        self._thread.start()
        settings = {
            "listen": "127.0.0.1:0",
            "pool_size": POOL_SIZE,
            "host_handlers": HOST_HANDLERS,
            "host_handler_timeout_s": 1.0,
            "shutdown_grace_s": 5.0,
            **config,
        }
        self.server = SandboxServer(ServerConfig(**settings))
        self.address = self.call(self.server.start())
        backend = self.server.engine.config.backends["process"]
        self.settle()
        self.runtime_dir: Path = backend._runtime_dir  # type: ignore[attr-defined]
        self.client = Client(self.address)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 110) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def run_async(self, make: Any, timeout: float = 110) -> Any:
        """Runs ``await make(client)`` with a fresh AsyncClient on a loop of its own."""

        async def main() -> Any:
            async with AsyncClient(self.address) as client:
                return await make(client)

        return asyncio.run(asyncio.wait_for(main(), timeout))

    def health(self) -> int:
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(service="")).status)

    def assert_healthy(self) -> None:
        assert self.health() == health_pb2.HealthCheckResponse.SERVING
        result = self.client.execute("print('still ok')")
        assert (result.status, result.stdout) == ("ok", "still ok\n")

    def settle(self) -> None:
        """Waits until the warm pool is full and no sandbox is starting."""
        backend = self.server.engine.config.backends["process"]
        pool = backend.pool
        assert pool is not None, "the process backend keeps a warm pool"
        self.call(pool.wait_ready())

    def close(self) -> None:
        self.client.close()
        # Closing while a sandbox is starting leaks its channel's StreamWriter (reported in
        # sandbox/backends/process/sandbox.py's spawn_sandbox): let the refills finish first.
        self.settle()
        self.call(self.server.stop(grace_s=5.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def leftovers(self) -> list[str]:
        problems = [
            f"process {p.pid}: {' '.join(p.cmdline())[:100]}"
            for p in psutil.Process().children(recursive=True)
        ]
        # Other engineers' test runs create /tmp/ptc-* entries at the same time: check our own.
        if self.runtime_dir.exists():
            problems.append(f"runtime dir {self.runtime_dir}")
        return problems


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHarness]:
    harness = ServerHarness()
    yield harness
    harness.close()
    assert harness.leftovers() == []


@pytest.fixture(scope="module")
def server_harness() -> type[ServerHarness]:
    """The harness class, for modules that start a server of their own configuration."""
    return ServerHarness
