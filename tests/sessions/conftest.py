"""A real gRPC server with sessions: the process backend, and the Docker backend where there is
an engine. Two tenants with keys, a third that may not open sessions, and a SQLite audit store,
so that tests can check isolation, quotas and the audit chain of sessions.

One server per module and backend; tests close the sessions they open, and the module checks at
the end that no session is left open and no process it started survives.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from sandbox.client import Client
from sandbox.server import SandboxServer, ServerConfig
from sandbox.tenants import hash_key

T = TypeVar("T")
KEY_A, KEY_B, KEY_NOSESS = "key-acme", "key-globex", "key-initech"


def _tenants() -> str:
    return (
        f'[[tenant]]\nid = "acme"\nkeys = ["{hash_key(KEY_A)}"]\nmax_sessions = 3\n'
        "session_idle_timeout_s = 120\nsession_max_lifetime_s = 600\n"
        f'[[tenant]]\nid = "globex"\nkeys = ["{hash_key(KEY_B)}"]\n'
        f'[[tenant]]\nid = "initech"\nkeys = ["{hash_key(KEY_NOSESS)}"]\nsessions = "denied"\n'
    )


class SessionServer:
    def __init__(self, tmp: Path, backend: str, audit_db: str | None = None) -> None:
        (tmp / "tenants.toml").write_text(_tenants())
        self.audit_db = audit_db or str(tmp / "audit.db")
        self.backend = backend
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="server", daemon=True)
        self._thread.start()
        self.server = SandboxServer(
            ServerConfig(
                listen="127.0.0.1:0",
                pool_size=2,
                tenants=str(tmp / "tenants.toml"),
                audit_db=self.audit_db,
                shutdown_grace_s=2.0,
                docker=backend == "docker",
            )
        )
        self.address = self.call(self.server.start())
        self.a = Client(self.address, KEY_A)
        self.b = Client(self.address, KEY_B)
        self.nosess = Client(self.address, KEY_NOSESS)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 110) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def open_sessions(self) -> int:
        return len(self.server.runner.sessions._sessions)

    def assert_healthy(self) -> None:
        result = self.a.execute("print('still ok')", backend=self.backend)
        assert (result.status, result.stdout) == ("ok", "still ok\n")

    def close(self) -> None:
        for client in (self.a, self.b, self.nosess):
            client.close()
        self.call(self.server.stop(grace_s=2.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(
    scope="module", params=["process", pytest.param("docker", marks=pytest.mark.requires_docker)]
)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionServer]:
    server = SessionServer(tmp_path_factory.mktemp(f"sessions-{request.param}"), request.param)
    yield server
    assert server.open_sessions() == 0, "a test left a session open"
    server.close()
    leftovers = [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]
    assert leftovers == []
