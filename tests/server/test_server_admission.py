"""Tenant admission through a real gRPC server, on the fake backend: a tenant's concurrency and
bounded queue, another tenant admitted meanwhile, and the audit records of what was admitted.

A real sandbox adds nothing here (what is checked happens before and after it), so the server's
engine runs `sandbox.backends.fake.FakeBackend`: scripts ``wait("go")`` until the test opens the
gate, which makes "running" and "queued" states the test can hold still instead of timing them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandbox.backends.fake import FakeBackend
from sandbox.client import AsyncClient, ExecutionPage
from sandbox.engine import Engine, EngineConfig
from sandbox.errors import ResourceExhausted, Unauthenticated
from sandbox.result import ExecutionResult
from sandbox.server import SandboxServer, ServerConfig
from sandbox.tenants import hash_key

T = TypeVar("T")


class FakeServer:
    """A SandboxServer on a loop thread of its own, its engine on a FakeBackend."""

    def __init__(self, tmp_path: Path, tenants: str) -> None:
        path = tmp_path / "tenants.toml"
        path.write_text(tenants)
        self.backend = FakeBackend()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server = SandboxServer(
            ServerConfig(listen="127.0.0.1:0", tenants=str(path), shutdown_grace_s=2.0),
            engine=Engine(EngineConfig(backends={"process": self.backend})),
        )
        self.address = self.call(self.server.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(30)

    def queued(self, tenant: str) -> int:
        gate = self.server.tenancy._gates.get(tenant)  # type: ignore[attr-defined]
        return len(gate.waiters) if gate is not None else 0

    def close(self) -> None:
        self.backend.gate("go").set()
        self.call(self.server.stop(grace_s=2.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _tenant(tid: str, key: str, **fields: object) -> str:
    lines = [f'[[tenant]]\nid = "{tid}"\nkeys = ["{hash_key(key)}"]']
    lines += [f"{name} = {value}" for name, value in fields.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[FakeServer]:
    server = FakeServer(
        tmp_path, _tenant("acme", "key-a", max_concurrent=1, queue=1) + _tenant("globex", "key-g")
    )
    yield server
    server.close()
    assert server.backend.running == 0


async def _until(predicate: Any) -> None:
    for _ in range(2000):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the server never got there")


def test_concurrency_and_queue_per_tenant_with_other_tenants_unaffected(
    fake_server: FakeServer,
) -> None:
    backend = fake_server.backend

    async def scenario() -> tuple[
        tuple[ExecutionResult, ExecutionResult], ExecutionResult, ResourceExhausted, ExecutionPage
    ]:
        async with (
            AsyncClient(fake_server.address, api_key="key-a") as acme,
            AsyncClient(fake_server.address, api_key="key-g") as globex,
        ):
            first = asyncio.create_task(acme.execute('print("first")\nwait("go")'))
            await _until(lambda: backend.running == 1)
            second = asyncio.create_task(acme.execute('print("second")\nwait("go")'))
            await _until(lambda: fake_server.queued("acme") == 1)
            # acme: one running (its maximum) and one waiting (its queue): the third is refused.
            with pytest.raises(ResourceExhausted) as refused:
                await acme.execute('print("third")')
            # globex has slots of its own: admitted at once while acme is full.
            other = await globex.execute('print("globex")')
            assert backend.started == 2 and fake_server.queued("acme") == 1
            backend.gate("go").set()
            done = await asyncio.gather(first, second)
            records = await acme.list_executions()
            return done, other, refused.value, records

    done, other, refused, records = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [(r.status, r.stdout) for r in done] == [("ok", "first\n"), ("ok", "second\n")]
    assert (other.status, other.stdout) == ("ok", "globex\n")
    assert "1 executions running (the maximum) and 1 waiting (the queue is full)" in (
        refused.message
    )
    assert refused.retry_after_s is not None and refused.retry_after_s > 0
    # acme never had two sandboxes at once; three were started in all (the third never was).
    assert backend.started == 3
    assert backend.peak_running == 2  # acme's one and globex's one
    # Only what was admitted is recorded, each under its own tenant.
    acme_ids = {r.execution_id for r in done}
    assert {rec.execution_id for rec in records.records} == acme_ids
    assert {rec.tenant for rec in records.records} == {"acme"}


def test_unknown_key_is_refused_before_any_sandbox(fake_server: FakeServer) -> None:
    async def scenario() -> None:
        async with AsyncClient(fake_server.address, api_key="key-nobody") as client:
            with pytest.raises(Unauthenticated, match="unknown API key"):
                await client.execute('print("x")')

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert fake_server.backend.started == 0
