"""Helpers of the telemetry tests: a real `SandboxServer` on an ephemeral loopback port, in this process.

In-process so that the server's spans and the client's land in the same OpenTelemetry SDK
in-memory exporter: the span tree across the gRPC stream is then checked whole. The server runs
on its own event loop in a daemon thread; clients talk to it over real gRPC. `ptc serve` and
`ptc run` as real processes are in the OTLP and Prometheus tests.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from sandbox.client import Client
from sandbox.server import SandboxServer, ServerConfig

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def echo_manifest(*names: str, mode: str = "echo", read_only: bool = True) -> str:
    return json.dumps(
        [
            {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}},
                    "required": ["x"],
                },
                "x-ptc": {"mode": mode, "read_only": read_only},
            }
            for name in names
        ]
    )


class InProcessServer:
    def __init__(self, **config: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="server", daemon=True)
        self._thread.start()
        settings = {"listen": "127.0.0.1:0", "pool_size": 2, **config}
        self.server = SandboxServer(ServerConfig(**settings))
        self.address = self.call(self.server.start())
        self.settle()
        self.client = Client(self.address)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def settle(self) -> None:
        backend = self.server.engine.config.backends["process"]
        pool = backend.pool
        assert pool is not None, "the process backend keeps a warm pool"
        self.call(pool.wait_ready())

    def close(self) -> None:
        self.client.close()
        self.settle()
        self.call(self.server.stop(grace_s=5.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
