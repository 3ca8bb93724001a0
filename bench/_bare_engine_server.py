"""The engine behind a bare ``grpc.aio`` server: ``ptc serve`` without any of its own layers.

Run as a script: ``python bench/_bare_engine_server.py`` with ``PYTHONPATH`` naming the
checkout; it prints ``listening on HOST:PORT`` and serves until SIGTERM. Its one method is the
real ``Execute`` (the SDK's `AsyncClient` calls it as it calls ``ptc serve``), on the server's
event loop (uvloop where installed), and it does what a served execution cannot do without: it
runs the request's script through an `Engine` (the process backend, its default pool) and
answers with `sandbox.codec.result.result_to_proto`. Nothing else: no interceptor, no tenancy or
admission, no idempotency look-up, no audit, no metrics or tracing, no checks of the request
beyond the engine's. `bench.serve_profile --bare` runs it beside ``ptc serve``: the difference
is what our serving layers cost, the difference to the embedded engine what gRPC costs a
served execution in the engine's own process and loop.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

# This file's directory is the script's sys.path[0]: bench/grpc.py there would shadow gRPC.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

import sandbox  # noqa: F401  first: it configures gRPC's fork handling

# isort: split
import asyncio

from grpc import aio

from sandbox import eventloop
from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.codec.result import result_to_proto
from sandbox.engine import Engine, ExecutionRequest


class BareServicer(pb_grpc.SandboxServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def Execute(self, request: pb.ExecuteRequest, context: Any) -> pb.ExecutionResult:
        return result_to_proto(await self.engine.execute(ExecutionRequest(request.script)))


async def main() -> None:
    engine = Engine()
    await engine.start()
    pool = engine.backend("process").pool
    assert pool is not None  # the process backend pools its sandboxes
    await pool.wait_ready()
    server = aio.server()
    pb_grpc.add_SandboxServiceServicer_to_server(BareServicer(engine), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    try:
        await stopping.wait()
    finally:
        await server.stop(1)
        await engine.close()


if __name__ == "__main__":
    eventloop.run(main())
