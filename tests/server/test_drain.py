"""`SandboxServer.stop` drains in order, in process (the `ptc serve` + SIGTERM case under load
is in test_fleet.py): health and readiness NOT_SERVING at once while the listener still answers,
new executions and replays refused with UNAVAILABLE and the reason, reads still served, the in-flight
execution finished and recorded, then the listener closed. The sandbox is the `FakeBackend`,
whose ``wait("go")`` holds an execution until the test lets it go."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.backends.fake import FakeBackend
from sandbox.client import AsyncClient
from sandbox.engine import Engine, EngineConfig
from sandbox.errors import Unavailable
from sandbox.server import SandboxServer, ServerConfig
from sandbox.server.fleet import DRAINING_MESSAGE, READINESS_SERVICE

T = TypeVar("T")
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


def test_stop_drains_in_order(tmp_path: Path) -> None:
    backend = FakeBackend()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, loop)
        return future.result(30)

    server = SandboxServer(
        ServerConfig(listen="127.0.0.1:0", audit_db=str(tmp_path / "audit.db")),
        engine=Engine(EngineConfig(backends={"process": backend})),
    )
    address = call(server.start())

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with AsyncClient(address) as client:
            channel = grpc.aio.insecure_channel(address)
            health = health_pb2_grpc.HealthStub(channel)

            async def status(service: str) -> int:
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                return int(reply.status)

            seen["before"] = (await status(""), await status(READINESS_SERVICE))
            earlier = await client.execute('print("earlier")')
            held = asyncio.ensure_future(client.execute('wait("go")\nprint("finished")'))
            while backend.running == 0:
                await asyncio.sleep(0.01)
            stopping = asyncio.ensure_future(server.stop(grace_s=20))
            await asyncio.sleep(0.05)
            seen["draining"] = (await status(""), await status(READINESS_SERVICE))
            try:
                await client.execute('print("late")')
            except Unavailable as exc:
                seen["refused"] = exc.message
            try:
                await client.replay(earlier.execution_id)
            except Unavailable as exc:
                seen["replay refused"] = exc.message
            seen["listed"] = len((await client.list_executions()).records)
            seen["stopped early"] = stopping.done()
            backend.gate("go").set()
            result = await held
            seen["held"] = (str(result.status), result.stdout)
            await stopping
            seen["after"] = await _unreachable(health)
            await channel.close(None)
        return seen

    try:
        seen = call(scenario())
    finally:
        backend.gate("go").set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert seen == {
        "before": (SERVING, SERVING),
        "draining": (NOT_SERVING, NOT_SERVING),
        "refused": DRAINING_MESSAGE,
        "replay refused": DRAINING_MESSAGE,
        "listed": 2,  # reads are still served while draining
        "stopped early": False,
        "held": ("ok", "finished\n"),
        "after": grpc.StatusCode.UNAVAILABLE,
    }


async def _unreachable(health: health_pb2_grpc.HealthStub) -> grpc.StatusCode | None:
    try:
        await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return None
