"""Sandbox benchmarks: latency, tool-call overhead, fan-out, throughput, memory per sandbox.

Run: ``python -m bench.sandbox [--rounds N]`` (needs bubblewrap and cgroups, like the process
backend). Every figure is printed next to a baseline measured in the same run, since the
machines are shared and noisy:

1. ``print(1)`` end to end through the embedded `Engine` with a warm pool (the pool is full and
   idle before each timed run), p50/p95, against spawning ``python3 -I -S -c pass`` by the real
   interpreter path. Target: ratio of p50s below 1.
2. One echo tool call from a script (10,000 sequential calls, timed inside the script; median
   of 3 runs) against a bare round trip of the same JSON frames over a socketpair between two
   processes, JSON encode/decode included. Targets: at most 2x; 10,000 calls in at most 1 s.
   Also printed: the host CPU per call, and both figures with the channel threads' spinning
   turned off (`sandbox.backends.channel` says why they spin).
3. Fan-out: 1,000 ``asyncio.gather``-ed calls to a read-only tool whose host handler sleeps
   10 ms, timed inside the script. Target: at most 0.5 s.
4. Executions per second of ``print(1)`` at concurrency 2, 8 and 32.
5. Memory of one idle pooled sandbox: its cgroup's charge and the PSS of its processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import time
from dataclasses import replace
from typing import Any

import psutil

from sandbox.backends.channel import allow_spinners
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
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


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def slow_handler(call: ToolCall) -> Any:
    await asyncio.sleep(0.01)
    return call.arguments


# -- 1. print(1) vs a bare interpreter ---------------------------------------------------------
async def latency(engine: Engine, backend: ProcessBackend, rounds: int) -> None:
    bare: list[float] = []
    ours: list[float] = []
    for _ in range(rounds):
        t = time.perf_counter()
        subprocess.run([REAL_PYTHON, "-I", "-S", "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t)
        await backend.pool.wait_ready()
        await backend.drain()
        await asyncio.sleep(0.02)
        t = time.perf_counter()
        result = await engine.execute(ExecutionRequest("print(1)"))
        ours.append(time.perf_counter() - t)
        assert result.stdout == "1\n", result.to_json()
    b50, o50 = statistics.median(bare), statistics.median(ours)
    print("1. print(1), end to end, warm pool")
    for label, values in (
        (f"python3 -I -S -c pass ({REAL_PYTHON})", bare),
        ("Engine.execute print(1)", ours),
    ):
        p50, p95 = statistics.median(values) * 1e3, pct(values, 0.95) * 1e3
        print(f"   {label:<40} p50 {p50:.2f} ms  p95 {p95:.2f} ms")
    print(f"   ratio p50 {o50 / b50:.2f}x  (target < 1)")


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


async def call_overhead(engine: Engine) -> None:
    n = 10_000
    bare = statistics.median(bare_round_trips(n) for _ in range(3))
    per_call, host_cpu = sorted([await echo_calls(engine, n) for _ in range(3)])[1]
    allow_spinners(0)
    try:
        no_spin, no_spin_cpu = sorted([await echo_calls(engine, n) for _ in range(3)])[1]
    finally:
        allow_spinners(DEFAULT_SPINNERS)
    print("2. one echo tool call from a script vs a bare socketpair round trip (same frames)")
    print(f"   bare round trip, two processes:     {bare * 1e6:.1f} us")
    print(
        f"   echo call through stub + broker:    {per_call * 1e6:.1f} us  "
        f"(host CPU {host_cpu * 1e6:.1f} us per call; median of 3 runs)"
    )
    print(f"   ratio {per_call / bare:.2f}x  (target <= 2x)")
    print(f"   {n} sequential calls: {per_call * n:.3f} s  (target <= 1 s)")
    print(
        f"   same, channel threads not spinning: {no_spin * 1e6:.1f} us = {no_spin / bare:.2f}x "
        f"(host CPU {no_spin_cpu * 1e6:.1f} us per call)"
    )


FAN_OUT_SCRIPT = """
import asyncio, time, tools
t = time.perf_counter()
await asyncio.gather(*(tools.aio.slow(i=i) for i in range(1000)))
print(time.perf_counter() - t)
"""


async def fan_out(engine: Engine) -> None:
    result = await engine.execute(
        ExecutionRequest(FAN_OUT_SCRIPT, ECHO), handlers={"host": slow_handler}
    )
    assert result.status == "ok", result.to_json()
    print("3. fan-out: 1,000 gathered calls to a read-only tool whose handler sleeps 10 ms")
    print(f"   {float(result.stdout):.3f} s  (target <= 0.5 s; serial would be 10 s)")


async def throughput(engine: Engine, total: int) -> None:
    print("4. executions per second of print(1)")
    for concurrency in (2, 8, 32):
        slots = asyncio.Semaphore(concurrency)

        async def one(slots: asyncio.Semaphore = slots) -> None:
            async with slots:
                result = await engine.execute(ExecutionRequest("print(1)"))
                assert result.status == "ok"

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        elapsed = time.perf_counter() - t
        print(
            f"   concurrency {concurrency:>2}: {total / elapsed:6.1f} executions/s ({total} runs)"
        )


def memory(backend: ProcessBackend) -> None:
    print("5. memory of one idle pooled sandbox")
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
        procs = [psutil.Process(handle.proc.pid)]
        procs += procs[0].children(recursive=True)
        for proc in procs:
            try:
                pss += proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        print(
            f"   cgroup charge {charge / 2**20:.1f} MiB, PSS of its {len(procs)} processes "
            f"{pss / 2**20:.1f} MiB"
        )


async def main(rounds: int, pool: int) -> None:
    backend = ProcessBackend(ProcessBackendConfig(pool_size=pool))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        await backend.pool.wait_ready()
        print(f"pool size {pool}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        await latency(engine, backend, rounds)
        await call_overhead(engine)
        await fan_out(engine)
        await throughput(engine, max(64, rounds))
        await backend.pool.wait_ready()
        await backend.drain()
        memory(backend)
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.pool))
