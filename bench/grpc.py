"""gRPC service benchmark: what the network path adds to an execution, and what it sustains.

Run: ``python -m bench.grpc`` (needs bubblewrap, like the process backend). The server is a real
``ptc serve`` subprocess on a loopback port; the embedded baseline is `Engine.execute` in this
process, with a warm pool of the same size. Printed:

1. ``print(1)``: embedded `Engine.execute` vs unary gRPC `Execute`, p50/p95, one side after the
   other with the same pacing, and the p50 the network path adds (target <= 1.5 ms).
2. Tool-call round trip as the script sees it (timed inside the sandbox around each call): an
   `echo` tool served by the server vs a `client` tool whose call travels over the stream to this
   client and back (target for the client-side call <= 300 us p50; the difference is what the
   stream adds).
3. Executions per second of ``print(1)`` at concurrency 32: gRPC `Execute` vs embedded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.client import AsyncClient, tool
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

ROOT = Path(__file__).resolve().parents[1]
POOL = 4
ROUNDS = 100
PACE_S = 0.1  # lets the warm pool refill between sequential runs, on both sides alike
CALLS = 300
CONCURRENCY = 32
THROUGHPUT_RUNS = 320


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@tool(read_only=True)
async def client_echo(x: int) -> int:
    """Returns its argument, on the client."""
    return x


def timing_script(tool_name: str) -> str:
    return (
        "import time, tools, json\n"
        "out = []\n"
        f"for i in range({CALLS}):\n"
        "    t = time.perf_counter()\n"
        f"    tools.{tool_name}(x=i)\n"
        "    out.append(time.perf_counter() - t)\n"
        "print(json.dumps(out))\n"
    )


ECHO_MANIFEST = json.dumps(
    [
        {
            "name": "echo_x",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "x-ptc": {"mode": "echo", "read_only": True},
        }
    ]
)


def start_server() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0",
         "--pool-size", str(POOL)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise SystemExit(f"ptc serve did not start: {line!r}")
    return proc, line.split()[-1]


async def bench() -> None:
    proc, address = start_server()
    backend = ProcessBackend(ProcessBackendConfig(pool_size=POOL))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    await backend.pool.wait_ready()
    request = ExecutionRequest(script="print(1)")
    try:
        async with AsyncClient(address) as client:
            for _ in range(10):  # warm both paths
                await client.execute("print(1)")
                await engine.execute(request)
            await asyncio.sleep(0.5)

            # One side at a time: the server's pool refills in another process, and while it
            # does it competes for the same CPUs; pacing lets each refill finish between runs.
            embedded: list[float] = []
            remote: list[float] = []
            for _ in range(ROUNDS):
                t = time.perf_counter()
                await engine.execute(request)
                embedded.append(time.perf_counter() - t)
                await asyncio.sleep(PACE_S)
            for _ in range(ROUNDS):
                t = time.perf_counter()
                await client.execute("print(1)")
                remote.append(time.perf_counter() - t)
                await asyncio.sleep(PACE_S)
            e50, r50 = pct(embedded, 0.5) * 1e3, pct(remote, 0.5) * 1e3
            print(f"print(1), {ROUNDS} sequential runs each (ms):")
            print(
                f"  embedded Engine.execute  p50 {e50:7.2f}  p95 {pct(embedded, 0.95) * 1e3:7.2f}"
            )
            print(f"  gRPC Execute             p50 {r50:7.2f}  p95 {pct(remote, 0.95) * 1e3:7.2f}")
            print(f"  added by gRPC            p50 {r50 - e50:7.2f}  ratio {r50 / e50:.2f}x"
                  "   (target <= 1.5 ms)")  # fmt: skip

            echo = await client.execute(timing_script("echo_x"), json.loads(ECHO_MANIFEST))
            streamed = await client.run(timing_script("client_echo"), tools=[client_echo])
            echo_t = json.loads(echo.stdout)[10:]
            stream_t = json.loads(streamed.stdout)[10:]
            s50, c50 = pct(echo_t, 0.5) * 1e6, pct(stream_t, 0.5) * 1e6
            print(f"\ntool-call round trip seen by the script, {len(echo_t)} calls each (us):")
            print(f"  echo tool (server)       p50 {s50:7.0f}  p95 {pct(echo_t, 0.95) * 1e6:7.0f}")
            print(f"  client tool (stream)     p50 {c50:7.0f}  p95 {pct(stream_t, 0.95) * 1e6:7.0f}"
                  "   (target <= 300 us)")  # fmt: skip
            print(f"  added by the stream      p50 {c50 - s50:7.0f}  ratio {c50 / s50:.2f}x")

            async def throughput(run: object) -> float:
                slots = asyncio.Semaphore(CONCURRENCY)

                async def one() -> None:
                    async with slots:
                        await run()  # type: ignore[operator]

                t = time.perf_counter()
                await asyncio.gather(*(one() for _ in range(THROUGHPUT_RUNS)))
                return THROUGHPUT_RUNS / (time.perf_counter() - t)

            await asyncio.sleep(0.5)
            grpc_rate = await throughput(lambda: client.execute("print(1)"))
            await asyncio.sleep(0.5)
            embedded_rate = await throughput(lambda: engine.execute(request))
            print(f"\nexecutions/s of print(1) at concurrency {CONCURRENCY}, pool {POOL}, "
                  f"{THROUGHPUT_RUNS} runs:")  # fmt: skip
            print(f"  gRPC Execute             {grpc_rate:7.1f}/s")
            print(f"  embedded Engine.execute  {embedded_rate:7.1f}/s"
                  f"   (gRPC/embedded {grpc_rate / embedded_rate:.2f}x)")  # fmt: skip
    finally:
        await engine.close()
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


if __name__ == "__main__":
    asyncio.run(bench())
