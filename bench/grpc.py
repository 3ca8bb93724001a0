"""gRPC service benchmark: what the network path adds to an execution, and what it sustains.

Run: ``python -m bench.grpc [--pool N] [--rounds N]`` (needs bubblewrap, like the process
backend). Three ways to run the same ``print(1)`` are measured in one run:

- ``embedded``: `Engine.execute` in this process;
- ``in-process gRPC``: a `SandboxServer` in this process, wrapping that very engine (same pool),
  called over loopback by a client on the same event loop;
- ``gRPC``: a real ``ptc serve`` subprocess (its own pool of the same size) over loopback.

Fairness: the three are interleaved run by run (in a rotating order, so slow drifts of the load on
a shared machine hit all alike; `bench.harness`, after ``--warmup`` discarded blocks), and before
every timed run both pools are full and idle: this process's pool is waited for, and the pause
after each run (``PACE_S``) is several times the time a pool takes to refill after one run, which
is printed as evidence. No pool refills while another side is timed.

Floors measured in the same run, against the same subprocess server: a bare unary RPC (health
``Check``), and a bare bidirectional-stream round trip (a minimal echo servicer in a subprocess,
``python -m bench.grpc --echo-server``). The unary floor is measured twice: back to back, and
*paced*, i.e. in the rotation of the ``print(1)`` runs, after the same pause. The paced one is the
floor those runs are compared with: after an idle pause every thread a gRPC call hops through
(the client's and the server's gRPC threads, the pollers, both event loops) has to be woken again,
and on a VM whose idle vCPUs halt that costs about twice the back-to-back figure. Every paced run
pays it, the embedded one far less (it wakes no other process but the sandbox). Printed:

1. ``print(1)`` p50/p95 for the three ways, what gRPC adds (target <= 1.5 ms p50), and what it
   adds beyond the paced bare RPC: the server's and client's own share.
2. Tool-call round trip as the script sees it (timed inside the sandbox around each call): an
   ``echo`` tool served by the server vs a ``client`` tool whose call travels over the stream to
   this client and back (target for the client-side call <= 300 us p50), for both servers.
3. Executions per second of ``print(1)`` at concurrency 32, embedded and gRPC in interleaved
   blocks (``--blocks``; each while the other side is idle), with the CPU time one execution
   costs and the sandbox start rate: on a 2-vCPU machine that, not the RPC layer, is the bound.

Every figure also goes to the run's JSON record (``bench/results/``, or ``--json-out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import sandbox  # noqa: F401  first: it configures gRPC's fork handling (see its __init__)

# isort: split
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.client import AsyncClient, tool
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.server import SandboxServer, ServerConfig

ROOT = Path(__file__).resolve().parents[1]
PACE_S = 0.15  # after each run: lets the pool that served it refill before anything is timed
CALLS = 300
SKIP_CALLS = 20  # the first calls of a script warm its caches; not part of the figure
FLOOR_ROUNDS = 500
FLOOR_BLOCK = 50
CONCURRENCY = 32
THROUGHPUT_RUNS = 320
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Run = Callable[[], Awaitable[Any]]


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


ECHO_MANIFEST = [
    {
        "name": "echo_x",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "x-ptc": {"mode": "echo", "read_only": True},
    }
]


# -- subprocesses ------------------------------------------------------------------------------
def spawn(
    args: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Starts a server subprocess (``python ARGS`` in ``cwd``); returns it and the address from
    its first line."""
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first.startswith("listening on "):
        proc.kill()
        proc.wait()
        raise SystemExit(f"{args} did not start: {first!r}")
    return proc, first.split()[-1]


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, and SIGKILL should it not exit within 30 s; reaped, its pipe closed."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def cpu_seconds(pid: int) -> float:
    """User + system time of a process and its reaped children (the sandboxes it ran)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class _Echo(pb_grpc.SandboxServiceServicer):  # type: ignore[misc]
    """The least a bidirectional stream can do: answer each message with one event."""

    async def ExecuteStream(
        self, requests: AsyncIterator[pb.ClientMessage], context: Any
    ) -> AsyncIterator[pb.ServerEvent]:
        async for message in requests:
            yield pb.ServerEvent(tool_call=pb.ToolCallRequest(seq=message.tool_answer.seq))


async def echo_server() -> None:
    server = aio.server()
    pb_grpc.add_SandboxServiceServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


# -- floors ------------------------------------------------------------------------------------
async def floors(report: Report, unary_address: str, stream_address: str) -> None:
    """A bare unary RPC and a bare stream round trip, interleaved, back to back."""
    async with (
        aio.insecure_channel(unary_address) as unary,
        aio.insecure_channel(stream_address) as streaming,
    ):
        check = health_pb2_grpc.HealthStub(unary).Check
        request = health_pb2.HealthCheckRequest()
        call = pb_grpc.SandboxServiceStub(streaming).ExecuteStream()
        seq = iter(range(1 << 30))

        async def round_trip() -> None:
            await call.write(pb.ClientMessage(tool_answer=pb.ToolCallAnswer(seq=next(seq))))
            await call.read()

        times = await interleave(
            {
                "bare unary RPC (health)": lambda: check(request),
                "bare stream round trip": round_trip,
            },
            FLOOR_ROUNDS // FLOOR_BLOCK,
            warmup=1,
            block=FLOOR_BLOCK,  # back to back within a block: the figure is the back-to-back one
        )
        await call.done_writing()
        await call.read()
    report.section(
        f"floors on loopback, {FLOOR_ROUNDS} each, back to back in interleaved blocks of "
        f"{FLOOR_BLOCK}"
    )
    for name, values in times.items():
        report.timings(name, values, unit="us")


# -- phases ------------------------------------------------------------------------------------
async def paced(backend: ProcessBackend, refills: list[float]) -> None:
    """Waits until this process's pool is full again, then the common pause."""
    t = time.perf_counter()
    await backend.pool.wait_ready()
    refills.append(time.perf_counter() - t)
    await asyncio.sleep(PACE_S)


async def latency(
    report: Report,
    ways: dict[str, Run],
    floor: tuple[str, Run],
    backend: ProcessBackend,
    rounds: int,
    warmup: int,
) -> None:
    """``ways`` and the paced ``floor`` (a bare RPC) in one rotation, with the same pacing."""
    refills: list[float] = []
    times = await interleave(
        {**ways, floor[0]: floor[1]},
        rounds,
        warmup=warmup,
        before=lambda: paced(backend, refills),
    )
    await paced(backend, refills)
    base = percentile(times["embedded"], 0.5)
    paced_floor = percentile(times[floor[0]], 0.5)
    report.section(
        f"print(1), {rounds} runs each, interleaved, each against a full idle pool (ms):"
    )
    report.timings(floor[0], times[floor[0]], note="   (the floor of the gRPC ways)")
    for name in ways:
        added = percentile(times[name], 0.5) - base
        beyond = added - paced_floor
        note = f"   added {added * 1e3:+6.2f}, beyond the paced RPC {beyond * 1e3:+6.2f}"
        report.timings(name, times[name], note="" if name == "embedded" else note)
    report.timings("pool refill after a run", refills, note=f"   then {PACE_S * 1e3:.0f} ms pause")
    report.print("   (target: gRPC adds <= 1.5 ms)")


async def tool_round_trips(report: Report, label: str, client: AsyncClient) -> None:
    echo = await client.execute(timing_script("echo_x"), ECHO_MANIFEST)
    streamed = await client.run(timing_script("client_echo"), tools=[client_echo])
    echo_t = json.loads(echo.stdout)[SKIP_CALLS:]
    stream_t = json.loads(streamed.stdout)[SKIP_CALLS:]
    added = (percentile(stream_t, 0.5) - percentile(echo_t, 0.5)) * 1e6
    report.print(f"  {label}:")
    report.timings(f"{label}: echo tool (on the server)", echo_t, unit="us")
    report.timings(
        f"{label}: client tool (the stream)", stream_t, unit="us", note=f"   added {added:+5.0f} us"
    )


async def throughput(run: Run, cpu: Callable[[], float], per_run: list[float]) -> float:
    """Executions per second at CONCURRENCY; appends the CPU seconds one run cost."""
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with slots:
            await run()

    cpu0, t = cpu(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(THROUGHPUT_RUNS)))
    elapsed = time.perf_counter() - t
    per_run.append((cpu() - cpu0) / THROUGHPUT_RUNS)
    return THROUGHPUT_RUNS / elapsed


async def bench(report: Report, pool_size: int, rounds: int, warmup: int, blocks: int) -> None:
    # `ptc serve` records every execution, as in production: in a SQLite file of this run's.
    audit_dir = tempfile.TemporaryDirectory(prefix="ptc-bench-")
    remote_proc, remote_address = spawn(
        [
            "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0",
            "--pool-size", str(pool_size), "--audit-db", f"{audit_dir.name}/audit.db",
        ]
    )  # fmt: skip
    echo_proc, echo_address = spawn(["-m", "bench.grpc", "--echo-server"])
    backend = ProcessBackend(ProcessBackendConfig(pool_size=pool_size))
    engine = Engine(EngineConfig(backends={"process": backend}))
    local_server = SandboxServer(ServerConfig(listen="127.0.0.1:0"), engine=engine)
    try:
        local_address = await local_server.start()  # starts the engine and its pool
        await backend.pool.wait_ready()
        request = ExecutionRequest(script="print(1)")
        async with AsyncClient(remote_address) as remote, AsyncClient(local_address) as local:
            await floors(report, remote_address, echo_address)
            async with aio.insecure_channel(remote_address) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check
                await check(health_pb2.HealthCheckRequest())
                await latency(
                    report,
                    {
                        "embedded": lambda: engine.execute(request),
                        "in-process gRPC": lambda: local.execute("print(1)"),
                        "gRPC (ptc serve)": lambda: remote.execute("print(1)"),
                    },
                    ("bare unary RPC, paced", lambda: check(health_pb2.HealthCheckRequest())),
                    backend,
                    rounds,
                    warmup,
                )

            report.section(
                f"tool-call round trip seen by the script, {CALLS - SKIP_CALLS} calls (us):"
            )
            await tool_round_trips(report, "gRPC (ptc serve)", remote)
            await tool_round_trips(report, "in-process gRPC", local)

            report.section(
                f"executions/s of print(1) at concurrency {CONCURRENCY}, {THROUGHPUT_RUNS} runs, "
                f"pool {pool_size} (one side at a time, {blocks} interleaved blocks):"
            )
            cpu: dict[str, list[float]] = {"embedded": [], "gRPC (ptc serve)": []}
            before = backend.pool.started_total

            async def idle() -> None:
                await backend.pool.wait_ready()
                await asyncio.sleep(1.0)

            rates = await interleave(
                {
                    "embedded": lambda: throughput(
                        lambda: engine.execute(request), own_cpu_seconds, cpu["embedded"]
                    ),
                    "gRPC (ptc serve)": lambda: throughput(
                        lambda: remote.execute("print(1)"),
                        lambda: cpu_seconds(remote_proc.pid) + own_cpu_seconds(),
                        cpu["gRPC (ptc serve)"],
                    ),
                },
                blocks,
                warmup=0,
                before=idle,
            )
            vcpus = os.cpu_count() or 1
            for label, values in rates.items():
                per_run = percentile(cpu[label], 0.5)
                report.figure(
                    label,
                    percentile(values, 0.5),
                    "/s",
                    f"CPU {per_run * 1e3:.1f} ms per run (all processes), i.e. at most "
                    f"{vcpus / per_run:.1f}/s on {vcpus} idle vCPUs",
                    ".1f",
                )
            started = backend.pool.started_total - before
            report.print(f"    ({started} sandboxes started by the embedded engine)")
    finally:
        await local_server.stop()
        stop(remote_proc)
        stop(echo_proc)
        audit_dir.cleanup()
    report.print(f"load average after: {os.getloadavg()}")


def main() -> None:
    parser = bench_parser(__doc__, rounds=100, warmup=5)
    parser.add_argument("--pool", type=int, default=4, help="warm pool size of both servers")
    parser.add_argument("--blocks", type=int, default=1, help="throughput blocks per side")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        asyncio.run(echo_server())
    else:
        with Report("grpc", args) as report:
            asyncio.run(bench(report, args.pool, args.rounds, args.warmup, args.blocks))


if __name__ == "__main__":
    main()
