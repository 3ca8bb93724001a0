"""A bare grpcio echo: what one unary call of a served execution's sizes costs, and nothing more.

Issue 40's yardstick for ``ptc serve``'s transport. The server (a subprocess) answers every
request with a reply of `REPLY_BYTES`; the client (another subprocess: its CPU is only its own)
sends `REQUEST_BYTES` back to back, ``concurrency`` at a time, from a ``grpc.aio`` channel as the
SDK's `AsyncClient` does. Both sizes are those of an ``Execute`` of ``print(1)`` with a small
manifest and of its `ExecutionResult` (about 1.5 KB each way). Two servers, as the issue asks:

- ``threads``: grpcio's synchronous server on its thread pool (4 workers);
- ``aio``: a ``grpc.aio`` server on uvloop, as ``ptc serve`` runs.

No method logic, no metadata, no interceptor, no protobuf: raw bytes in and out. Its CPU per
call, client and server together (utime + stime of each process over a block, after a warm-up),
is the least any gRPC service of these sizes pays per call on this machine; ``ptc serve``'s
transport is judged against it (`bench.serve_ceiling`). Back-to-back calls share wake-ups that
served executions, 20 ms apart, do not: `bench.grpc_floor` measures that paced case.

Alone: ``python -m bench.grpc_echo [--calls N] [--concurrency C] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc

from bench.grpc import cpu_seconds, spawn, stop
from bench.harness import percentile, run_in_slots

__all__ = ["KINDS", "REPLY_BYTES", "REQUEST_BYTES", "BareEcho"]

ROOT = Path(__file__).resolve().parent.parent
METHOD = "/bench.Echo/Echo"
# Issue 40's sizes: an Execute of print(1) with a small manifest and its ExecutionResult, about
# 1.5 KB each way (the benchmark's own print(1), with no manifest, sends less: see the report).
REQUEST_BYTES = 1500
REPLY_BYTES = 1500
KINDS = ("threads", "aio")
THREAD_POOL_WORKERS = 4


def _reply(_request: bytes, _context: object) -> bytes:
    return b"r" * REPLY_BYTES


def _serve_threads() -> None:
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_reply)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=THREAD_POOL_WORKERS))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


async def _serve_aio() -> None:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return _reply(request, context)

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


async def _client(address: str, server_pid: int, concurrency: int) -> None:
    """Reads a number of calls per line of stdin; for each, runs that many calls and writes one
    JSON line: calls/s and CPU per call (ms) of the server process and of this one."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD, None, None)
        request = b"q" * REQUEST_BYTES

        async def one() -> None:
            reply = await call(request)
            assert len(reply) == REPLY_BYTES

        await run_in_slots(one, 200, concurrency)  # warm: connection, threads, caches
        for line in sys.stdin:
            calls = int(line)
            server0, client0 = cpu_seconds(server_pid), time.process_time()
            started = time.perf_counter()
            await run_in_slots(one, calls, concurrency)
            elapsed = time.perf_counter() - started
            per = 1e3 / calls
            server = (cpu_seconds(server_pid) - server0) * per
            client = (time.process_time() - client0) * per
            figures = {"calls/s": calls / elapsed, "server": server, "client": client}
            print(json.dumps(figures), flush=True)


class BareEcho:
    """One echo server of ``kind`` (`KINDS`) and its client, each a subprocess of this one."""

    def __init__(self, kind: str, concurrency: int = 4) -> None:
        self.kind = kind
        self.server, address = spawn(["-m", "bench.grpc_echo", "--serve", kind])
        self.client = subprocess.Popen(
            [sys.executable, "-m", "bench.grpc_echo", "--client", address,
             "--server-pid", str(self.server.pid), "--concurrency", str(concurrency)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def block(self, calls: int) -> dict[str, float]:
        """Calls/s and CPU per call (ms): ``server``, ``client`` and ``echo`` (their sum)."""
        assert self.client.stdin is not None and self.client.stdout is not None
        self.client.stdin.write(f"{calls}\n")
        self.client.stdin.flush()
        line = self.client.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.kind} echo's client ended: {self.client.wait()}")
        figures: dict[str, float] = json.loads(line)
        figures["echo"] = figures["server"] + figures["client"]
        return figures

    def close(self) -> None:
        if self.client.stdin is not None:
            self.client.stdin.close()
        try:
            self.client.wait(30)
        except subprocess.TimeoutExpired:
            self.client.kill()
            self.client.wait()
        if self.client.stdout is not None:
            self.client.stdout.close()
        stop(self.server)


def _main(args: argparse.Namespace) -> None:
    echoes = [BareEcho(kind, args.concurrency) for kind in KINDS]
    try:
        blocks: dict[str, list[dict[str, float]]] = {e.kind: [] for e in echoes}
        for _ in range(args.rounds):
            for echo in echoes:
                blocks[echo.kind].append(echo.block(args.calls))
    finally:
        for echo in echoes:
            echo.close()
    for kind, runs in blocks.items():
        shown = "  ".join(
            f"{k} {percentile([r[k] for r in runs], 0.5):.3f}" for k in ("server", "client", "echo")
        )
        rate = percentile([r["calls/s"] for r in runs], 0.5)
        print(f"   bare echo, {kind:8s} ms CPU per call: {shown}  ({rate:.0f} calls/s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--serve", choices=KINDS, help="be the server (internal)")
    parser.add_argument("--client", metavar="ADDRESS", help="be the client (internal)")
    parser.add_argument("--server-pid", type=int, default=0, help="the client's server (internal)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per block")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parsed = parser.parse_args()
    if parsed.serve == "threads":
        _serve_threads()
    elif parsed.serve == "aio":
        import uvloop

        uvloop.install()
        asyncio.run(_serve_aio())
    elif parsed.client:
        asyncio.run(_client(parsed.client, parsed.server_pid, parsed.concurrency))
    else:
        _main(parsed)
