"""Readiness (`ptc.sandbox.v1.Readiness` in the health service) and `ptc health`.

Readiness fails while the warm pool is cold, while the audit store cannot be reached (a real
PostgreSQL behind a TCP relay the test cuts and restores), and while the server drains;
liveness (service ``""``) is unaffected by the pool and the store. `ptc health [--ready]` asks
a real `ptc serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.audit import open_store
from sandbox.backends.fake import FakeBackend
from sandbox.engine import Engine, EngineConfig
from sandbox.server import SandboxServer, ServerConfig
from sandbox.server.fleet import READINESS_SERVICE, Readiness
from tests.postgres_support import POSTGRES_URL, fresh_schema
from tests.ptc_cli import run_ptc as _ptc
from tests.ptc_serve import ptc_serve

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_readiness_waits_for_a_warm_pool_and_a_reachable_store(tmp_path: Path) -> None:
    store = open_store(tmp_path / "audit.db")
    readiness = Readiness(store)

    async def steps() -> list[tuple[bool, str | None]]:
        out = []
        for idle, draining in ((0, False), (1, False), (0, False), (None, False), (1, True)):
            ready = await readiness.check(True, idle, draining)
            out.append((ready, readiness.reason))
        store.close()  # a closed store cannot answer
        out.append((await readiness.check(True, 1, False), readiness.reason))
        await readiness.close()
        return out

    assert asyncio.run(steps()) == [
        (False, "the warm pool is cold"),
        (True, None),
        (True, None),  # once warm, an empty pool is a busy one, not a cold one
        (True, None),
        (False, "draining"),
        (False, "the audit store is unreachable"),
    ]


def test_ptc_health_asks_a_real_server(tmp_path: Path) -> None:
    with ptc_serve("--pool-size", "1", "--audit-db", str(tmp_path / "audit.db")) as serving:
        address = serving.address
        live = _ptc("health", "--server", address)
        assert (live.returncode, live.stdout) == (0, "SERVING\n"), live.stderr
        deadline = time.monotonic() + 30
        while (ready := _ptc("health", "--server", address, "--ready")).returncode != 0:
            assert (ready.returncode, ready.stdout) == (1, "NOT_SERVING\n"), ready.stderr
            assert time.monotonic() < deadline, "the server never became ready"
            time.sleep(0.2)
        assert ready.stdout == "SERVING\n"
        unknown = _ptc("health", "--server", address, "--service", "no.such.Service")
        assert (unknown.returncode, unknown.stdout) == (
            1,
            "UNKNOWN: the server has no health status for 'no.such.Service'\n",
        )
    assert (
        "quotas: per instance (the SQLite audit store is not shared): each server enforces a "
        "tenant's concurrency, queue and rate on its own"
    ) in serving.stderr
    gone = _ptc("health", "--server", "127.0.0.1:1", "--timeout", "2")
    assert gone.returncode == 12
    assert gone.stderr.startswith("ptc health: unavailable: server 127.0.0.1:1: "), gone.stderr


class _Relay:
    """A TCP port that forwards to PostgreSQL's Unix socket, and can be cut and restored."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.StreamWriter] = set()
        self.call(self._open())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(10)

    async def _open(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
        self._pipes |= {writer, up_writer}

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def _cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in self._pipes:
            pipe.close()
        self._pipes.clear()
        await self._server.wait_closed()

    def cut(self) -> None:
        self.call(self._cut())

    def restore(self) -> None:
        self.call(self._open())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def relayed_pg() -> Iterator[tuple[_Relay, str]]:
    query = parse_qs(urlparse(POSTGRES_URL).query)
    socket_path = f"{query['host'][0]}/.s.PGSQL.{query['port'][0]}"
    database = urlparse(POSTGRES_URL).path.lstrip("/")
    user = urlparse(POSTGRES_URL).username
    with fresh_schema("ptc_ready") as schema:
        relay = _Relay(socket_path)
        url = (
            f"postgresql://{user}@127.0.0.1:{relay.port}/{database}"
            f"?connect_timeout=2&options=-csearch_path%3D{schema.name}"
        )
        try:
            yield relay, url
        finally:
            relay.close()


@pytest.mark.requires_postgres
def test_readiness_follows_the_audit_store(relayed_pg: tuple[_Relay, str]) -> None:
    relay, url = relayed_pg
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    server = SandboxServer(
        ServerConfig(listen="127.0.0.1:0", audit_db=url, global_quotas=False),
        engine=Engine(EngineConfig(backends={"process": FakeBackend()})),
    )
    address = call(server.start())
    channel = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(channel)

    def wait_status(service: str, status: int) -> None:
        deadline = time.monotonic() + 20
        while True:
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            if reply.status == status:
                return
            assert time.monotonic() < deadline, (service, reply.status, server.readiness.reason)
            time.sleep(0.1)

    try:
        wait_status(READINESS_SERVICE, SERVING)
        relay.cut()
        wait_status(READINESS_SERVICE, NOT_SERVING)
        assert server.readiness.reason == "the audit store is unreachable"
        # liveness stays: restarting the server would not bring the database back
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == SERVING
        relay.restore()
        wait_status(READINESS_SERVICE, SERVING)
        assert server.readiness.reason is None
    finally:
        channel.close()
        call(server.stop(grace_s=1.0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("global_quotas = false\nquota_lease_ttl_s = 4", (False, 4.0)),
        ("quota_lease_ttl_s = 2.5", (True, 2.5)),
        ("", (True, 15.0)),
    ],
    ids=["both", "ttl-only", "defaults"],
)
def test_server_config_reads_the_fleet_keys(
    tmp_path: Path, text: str, expected: tuple[bool, float]
) -> None:
    from sandbox.server import load_config

    path = tmp_path / "server.toml"
    path.write_text(text)
    config = load_config(path)
    assert (config.global_quotas, config.quota_lease_ttl_s) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("global_quotas = 1", "global_quotas has the wrong type"),
        ("quota_lease_ttl_s = 0", "quota_lease_ttl_s must be positive"),
        ('quota_lease_ttl_s = "15"', "quota_lease_ttl_s has the wrong type"),
    ],
    ids=["quotas-not-bool", "ttl-zero", "ttl-string"],
)
def test_server_config_refuses_bad_fleet_keys(tmp_path: Path, text: str, error: str) -> None:
    from sandbox.errors import InvalidArgument
    from sandbox.server import load_config

    path = tmp_path / "server.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgument) as refused:
        load_config(path)
    assert str(refused.value) == f"config {path}: {error}"
