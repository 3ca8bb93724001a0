"""Fixtures of the integration tests: a real embedded runner, a real gRPC server, tool data.

`embedded` is one `EmbeddedRunner` on the real process backend per test module (only one
process backend may be open per process at a time, so never per session). `served` starts a
real `SandboxServer` on an ephemeral loopback port, in a thread of its own, and hands out a
`ClientRunner` connected to it. Both assert at teardown that no child process survived.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.backends.factory import BackendOptions, build_backend
from sandbox.engine import EngineConfig
from sandbox.integrations import ClientRunner, EmbeddedRunner
from tests.integrations.integration_support import leftover_children


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedRunner]:
    backend = build_backend("process", BackendOptions(pool_size=2))
    runner = EmbeddedRunner(EngineConfig(backends={"process": backend}))
    yield runner
    runner.close()
    assert leftover_children() == []


class _Served:
    def __init__(self) -> None:
        from sandbox.server import SandboxServer, ServerConfig

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = SandboxServer(ServerConfig(listen="127.0.0.1:0", pool_size=2))
        self.address: str = self._call(self.server.start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(110)

    def close(self) -> None:
        backend = self.server.engine.config.backends["process"]
        pool = backend.pool
        assert pool is not None, "the process backend keeps a warm pool"
        self._call(pool.wait_ready())
        self._call(self.server.stop(grace_s=5.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def served() -> Iterator[ClientRunner]:
    harness = _Served()
    runner = ClientRunner.connect(harness.address)
    yield runner
    runner.close()
    harness.close()
    assert leftover_children() == []
