"""What a bare gRPC unary call costs the machine at the rate and latency of a served execution.

`bench.forkserver` runs this beside ``ptc serve``: a ``grpc.aio`` server in a subprocess (on
uvloop where installed, as ``ptc serve`` is) whose one method does nothing but wait as long as a
served ``print(1)`` takes, and a ``grpc.aio`` client in the calling process, with request and
reply of about a served execution's sizes. Its CPU per call (the server process's and the
client's) is what gRPC itself costs a served execution before any of our code runs: at a
served execution's rate each call wakes gRPC's threads and both event loops anew, which costs
several times what back-to-back calls do. Alone: ``python -m bench.grpc_floor [--calls N]
[--concurrency C] [--delay-ms D]``.

Each call waits a different time, drawn uniformly from half to one and a half times the delay
asked for (the same mean, so the same rate), as served executions do. Calls that all wait
exactly as long run in lockstep: they start together, end together, and their replies share
every wake-up of both processes, which no served execution's do. That understated gRPC's cost
by about a third (on the 2-core machine at 4 at a time and 13.5 ms: client 0.195 against 0.27
ms per call, server 0.24 against 0.38; ``strace -c`` of the client: 0.6 reads of the socket
that found data per call against 1.0 when served).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import struct
import time

import grpc

from bench.grpc import cpu_seconds, spawn, stop
from bench.harness import run_in_slots

__all__ = ["BareGrpc", "call_waits"]

METHOD = "/bench.Bare/Wait"
REQUEST_PAD = 300  # bytes: about an ExecuteRequest of print(1) with its limits
REPLY_BYTES = 600  # about its ExecutionResult
DELAY = struct.Struct(">d")
JITTER = 0.5  # each call waits uniformly from (1 - JITTER) to (1 + JITTER) times the delay


async def _serve() -> None:
    async def wait(request: bytes, _context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        (delay_s,) = DELAY.unpack_from(request)
        await asyncio.sleep(delay_s)
        return b"r" * REPLY_BYTES

    handler = grpc.method_handlers_generic_handler(
        "bench.Bare", {"Wait": grpc.unary_unary_rpc_method_handler(wait)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def call_waits(calls: int, delay_s: float) -> list[float]:
    """How long each call of a block waits: from (1 - `JITTER`) to (1 + `JITTER`) times
    ``delay_s``, drawn from a generator seeded with ``calls``, so a block of the same size waits
    the same way run after run."""
    draw = random.Random(calls)
    return [delay_s * draw.uniform(1 - JITTER, 1 + JITTER) for _ in range(calls)]


class BareGrpc:
    """The bare server (a subprocess) and its client (this process's event loop)."""

    def __init__(self) -> None:
        self.proc, address = spawn(["-m", "bench.grpc_floor", "--serve"])
        self.channel = grpc.aio.insecure_channel(address)
        self.call = self.channel.unary_unary(METHOD, None, None)

    async def block(self, calls: int, concurrency: int, delay_s: float) -> dict[str, float]:
        """Calls/s, and CPU per call (ms) of the server process and of this process; each
        call waits as `call_waits` says."""
        requests = iter(
            [DELAY.pack(wait) + b"q" * REQUEST_PAD for wait in call_waits(calls, delay_s)]
        )

        async def one() -> None:
            reply = await self.call(next(requests))
            assert len(reply) == REPLY_BYTES

        server0, client0 = cpu_seconds(self.proc.pid), time.process_time()
        started = time.perf_counter()
        await run_in_slots(one, calls, concurrency)
        elapsed = time.perf_counter() - started
        per = 1e3 / calls
        return {
            "calls/s": calls / elapsed,
            "server process": (cpu_seconds(self.proc.pid) - server0) * per,
            "client (this process)": (time.process_time() - client0) * per,
        }

    async def close(self) -> None:
        await self.channel.close(None)
        stop(self.proc)


async def _main(args: argparse.Namespace) -> None:
    bare = BareGrpc()
    try:
        await bare.block(args.calls // 4, args.concurrency, args.delay_ms / 1e3)  # warm up
        figures = await bare.block(args.calls, args.concurrency, args.delay_ms / 1e3)
    finally:
        await bare.close()
    for name, value in figures.items():
        print(f"   {name:40s} {value:8.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="be the server (internal)")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay-ms", type=float, default=25.0, help="the method's wait")
    args = parser.parse_args()
    if args.serve:
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
    asyncio.run(_serve() if args.serve else _main(args))
