"""Sandbox benchmarks: latency, tool-call overhead, fan-out, throughput, memory per sandbox.

Run: ``python -m bench.sandbox [--rounds N]`` (needs bubblewrap and cgroups, like the process
backend). Every figure is printed next to a baseline measured in the same run, interleaved with
it block by block (`bench.harness`), since the machines are shared and noisy:

1. ``print(1)`` end to end through the embedded `Engine` with a warm pool (the pool is full and
   idle before each timed run), p50/p95, against spawning ``python3 -I -S -c pass`` by the real
   interpreter path. Target: ratio of p50s below 1.
2. One echo tool call from a script (10,000 sequential calls, timed inside the script; median
   of 3 interleaved blocks) against a bare round trip of the same JSON frames over a socketpair
   between two processes, JSON encode/decode included. Targets: at most 2x; 10,000 calls in at
   most 1 s.
   Also printed: the host CPU per call, and both figures with the channel threads' spinning
   turned off (`sandbox.backends.channel` says why they spin).
3. Fan-out: 1,000 ``asyncio.gather``-ed calls to a read-only tool whose host handler sleeps
   10 ms, timed inside the script. Target: at most 0.5 s.
4. Executions per second of ``print(1)`` at concurrency 2, 8 and 32.
5. Memory of one idle pooled sandbox: its cgroup's charge and the PSS of its processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import time
from dataclasses import replace
from typing import Any

import psutil

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.channel import allow_spinners
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, RunHooks
from sandbox.handlers import ToolCall
from sandbox.limits import Limits

HEADER = struct.Struct(">I")
DEFAULT_SPINNERS = (os.cpu_count() or 1) - 1
REAL_PYTHON = os.path.realpath("/usr/bin/python3")
ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
        "x-ptc": {"read_only": True},
    },
    {
        "name": "slow",
        "description": "Sleeps 10 ms on the host.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
        "x-ptc": {"mode": "host", "read_only": True},
    },
]


async def slow_handler(call: ToolCall) -> Any:
    await asyncio.sleep(0.01)
    return call.arguments


# -- 1. print(1) vs a bare interpreter ---------------------------------------------------------
async def latency(report: Report, engine: Engine, backend: ProcessBackend, rounds: int) -> None:
    async def quiet() -> None:
        await backend.pool.wait_ready()
        await backend.drain()
        await asyncio.sleep(0.02)

    async def ours() -> None:
        result = await engine.execute(ExecutionRequest("print(1)"))
        assert result.stdout == "1\n", result.to_json()

    bare_label = f"python3 -I -S -c pass ({REAL_PYTHON})"
    times = await interleave(
        {
            bare_label: lambda: subprocess.run([REAL_PYTHON, "-I", "-S", "-c", "pass"], check=True),
            "Engine.execute print(1)": ours,
        },
        rounds,
        before=quiet,
    )
    report.section("1. print(1), end to end, warm pool")
    for label, values in times.items():
        report.timings(label, values)
    ratio = percentile(times["Engine.execute print(1)"], 0.5) / percentile(times[bare_label], 0.5)
    report.figure("ratio p50", ratio, "x", "target < 1")


# -- 2. one echo call vs a bare socketpair round trip ---------------------------------------------
def _echo_peer(sock: socket.socket, n: int) -> None:
    for _ in range(n):
        (length,) = HEADER.unpack(_recv(sock, HEADER.size))
        call = json.loads(_recv(sock, length))
        reply = json.dumps(
            {"t": "result", "id": call["id"], "ok": True, "value": call["args"]},
            separators=(",", ":"),
        ).encode()
        sock.sendall(HEADER.pack(len(reply)) + reply)


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def bare_round_trips(n: int) -> float:
    """Seconds per round trip of the guest's call frame and the host's reply, two processes."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        try:
            _echo_peer(child, n)
        finally:
            os._exit(0)
    child.close()
    t = time.perf_counter()
    for i in range(n):
        body = json.dumps(
            {"t": "call", "id": i + 1, "tool": "echo", "args": {"i": i}}, separators=(",", ":")
        ).encode()
        parent.sendall(HEADER.pack(len(body)) + body)
        (length,) = HEADER.unpack(_recv(parent, HEADER.size))
        json.loads(_recv(parent, length))
    elapsed = time.perf_counter() - t
    os.waitpid(pid, 0)
    parent.close()
    return elapsed / n


CALLS_SCRIPT = """
import time, tools
t = time.perf_counter()
for i in range({n}):
    tools.echo(i=i)
print(time.perf_counter() - t)
"""


async def echo_calls(engine: Engine, n: int) -> tuple[float, float]:
    """Seconds per call as the script timed it, and this process's CPU seconds per call."""
    limits = replace(engine.effective_limits(Limits())[0], max_tool_calls=n)
    cpu = time.process_time()
    result = await engine.execute(
        ExecutionRequest(CALLS_SCRIPT.format(n=n), ECHO), limits=(limits, [])
    )
    cpu = time.process_time() - cpu
    assert result.status == "ok", result.to_json()
    return float(result.stdout) / n, cpu / n


async def call_overhead(report: Report, engine: Engine, blocks: int = 3) -> None:
    n = 10_000
    cpu: dict[str, list[float]] = {"spinning": [], "not spinning": []}

    async def echo(spinning: bool) -> float:
        if not spinning:
            allow_spinners(0)
        try:
            per_call, host_cpu = await echo_calls(engine, n)
        finally:
            allow_spinners(DEFAULT_SPINNERS)
        cpu["spinning" if spinning else "not spinning"].append(host_cpu)
        return per_call

    times = await interleave(
        {
            "bare round trip, two processes": lambda: bare_round_trips(n),
            "echo call through stub + broker": lambda: echo(True),
            "same, channel threads not spinning": lambda: echo(False),
        },
        blocks,
        warmup=0,
    )
    bare = percentile(times["bare round trip, two processes"], 0.5)
    per_call = percentile(times["echo call through stub + broker"], 0.5)
    no_spin = percentile(times["same, channel threads not spinning"], 0.5)
    report.section(
        "2. one echo tool call from a script vs a bare socketpair round trip (same frames)"
    )
    for label, values in times.items():
        report.timings(label, values, unit="us")
    report.figure("host CPU per call", percentile(cpu["spinning"], 0.5) * 1e6, "us")
    report.figure(
        "host CPU per call, not spinning", percentile(cpu["not spinning"], 0.5) * 1e6, "us"
    )
    report.figure("ratio", per_call / bare, "x", "target <= 2x")
    report.figure("ratio, not spinning", no_spin / bare, "x")
    report.figure(f"{n} sequential calls", per_call * n, "s", "target <= 1 s", ".3f")


FAN_OUT_SCRIPT = """
import asyncio, time, tools
t = time.perf_counter()
await asyncio.gather(*(tools.aio.slow(i=i) for i in range(1000)))
print(time.perf_counter() - t)
"""


async def fan_out(report: Report, engine: Engine) -> None:
    result = await engine.execute(
        ExecutionRequest(FAN_OUT_SCRIPT, ECHO), hooks=RunHooks(handlers={"host": slow_handler})
    )
    assert result.status == "ok", result.to_json()
    report.section(
        "3. fan-out: 1,000 gathered calls to a read-only tool whose handler sleeps 10 ms"
    )
    report.figure(
        "1,000 gathered calls", float(result.stdout), "s", "target <= 0.5 s; serial 10 s", ".3f"
    )


async def throughput(report: Report, engine: Engine, total: int) -> None:
    report.section("4. executions per second of print(1)")
    for concurrency in (2, 8, 32):
        slots = asyncio.Semaphore(concurrency)

        async def one(slots: asyncio.Semaphore = slots) -> None:
            async with slots:
                result = await engine.execute(ExecutionRequest("print(1)"))
                assert result.status == "ok"

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        elapsed = time.perf_counter() - t
        report.figure(
            f"concurrency {concurrency:>2}", total / elapsed, "executions/s", f"{total} runs", ".1f"
        )


def memory(report: Report, backend: ProcessBackend) -> None:
    report.section("5. memory of one idle pooled sandbox")
    for handle in list(backend.pool._idle):
        charge = 0
        if handle.cgroup is not None:
            for path in handle.cgroup.paths:
                usage = path / "memory.usage_in_bytes"
                current = path / "memory.current"
                for f in (usage, current):
                    if f.exists():
                        charge = int(f.read_text())
        pss = 0
        procs = [psutil.Process(handle.pid)]
        procs += procs[0].children(recursive=True)
        for proc in procs:
            try:
                pss += proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        report.figure("cgroup charge", charge / 2**20, "MiB", fmt=".1f")
        report.figure(f"PSS of its {len(procs)} processes", pss / 2**20, "MiB", fmt=".1f")


async def main(report: Report, rounds: int, pool: int, throughput_runs: int) -> None:
    backend = ProcessBackend(ProcessBackendConfig(pool_size=pool))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        await backend.pool.wait_ready()
        report.print(f"pool size {pool}")
        await latency(report, engine, backend, rounds)
        await call_overhead(report, engine)
        await fan_out(report, engine)
        await throughput(report, engine, throughput_runs)
        await backend.pool.wait_ready()
        await backend.drain()
        memory(report, backend)
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=40)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--throughput-runs", type=int, default=64)
    args = parser.parse_args()
    with Report("sandbox", args) as report:
        asyncio.run(main(report, args.rounds, args.pool, args.throughput_runs))
