"""Where the CPU of one forked sandbox goes: the breakdown behind `bench.forkserver`'s figures.

Run: ``python -m bench.forkserver_cost [--rounds N] [--warmup N] [--per-block N]`` as root. Runs
``print(1)`` through the embedded `Engine` (process backend) at concurrency 4, in blocks of
``--per-block`` executions after ``--warmup`` discarded blocks (the harness's `interleave`, with
one case: there is no second configuration to rotate with), and prints each figure's median over
the blocks (the harness's nearest-rank `percentile`), per execution:

- the machine's CPU (from /proc/stat: everything, other load included);
- our host process's CPU, user and system, and split by thread: the event loop, the threads
  alive at the end (the loop's worker threads), and the threads that ended meanwhile (each
  sandbox's channel thread);
- the zygote's CPU (its forks and their requests);
- the sandboxes' own CPU (their parent cgroup's: each sandbox from joining its cgroup to its exit,
  teardown included; `bench.floor.sandbox_cgroups_cpu_s`);
- what is left: the kernel's own threads (network namespace clean-up, RCU work) and other load;
- how often an acquire found no idle sandbox, and how long acquires waited.

A breakdown, not a target: the issue's targets are `bench.forkserver`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path

from bench.floor import sandbox_cgroups_cpu_s
from bench.forkserver import busy_cpu_s, zygote_cpu_s
from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

TICKS = os.sysconf("SC_CLK_TCK")
UNITLESS = {
    "executions/s",
    "acquires without an idle sandbox (%)",
    "execution wall p50 (ms)",
}


def thread_cpu_s() -> dict[int, float]:
    """CPU seconds of each of our threads alive now."""
    out: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


async def block(
    engine: Engine, backend: ProcessBackend, total: int, concurrency: int
) -> dict[str, float]:
    slots = asyncio.Semaphore(concurrency)
    waits: list[float] = []
    pool = backend.pool

    async def one() -> None:
        async with slots:
            started = time.perf_counter()
            result = await engine.execute(ExecutionRequest("print(1)"))
            assert result.status == "ok" and result.stdout == "1\n", result.to_json()
            waits.append(time.perf_counter() - started)

    me = threading.get_native_id()
    machine, threads, times = busy_cpu_s(), thread_cpu_s(), os.times()
    zygote, loop, misses = zygote_cpu_s(backend), time.thread_time(), pool.misses
    sandbox_cpu = sandbox_cgroups_cpu_s(os.getpid())
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    elapsed = time.perf_counter() - started
    loop = time.thread_time() - loop
    after, end = thread_cpu_s(), os.times()
    machine = busy_cpu_s() - machine
    zygote = zygote_cpu_s(backend) - zygote  # a zygote replaced meanwhile makes this low
    sandbox_cpu = sandbox_cgroups_cpu_s(os.getpid()) - sandbox_cpu  # exits included
    user, system = end.user - times.user, end.system - times.system
    alive = sum(cpu - threads.get(tid, 0.0) for tid, cpu in after.items() if tid != me)
    host = user + system
    per = 1e3 / total
    return {
        "executions/s": total / elapsed,
        "machine CPU": machine * per,
        "host process": host * per,
        "  user": user * per,
        "  system": system * per,
        "  event loop thread": loop * per,
        "  worker threads (alive)": alive * per,
        "  threads that ended (channels)": (host - loop - alive) * per,
        "zygote": zygote * per,
        "sandboxes (their cgroups)": sandbox_cpu * per,
        "rest (kernel threads, other load)": (machine - host - zygote - sandbox_cpu) * per,
        "acquires without an idle sandbox (%)": (pool.misses - misses) / total * 100,
        "execution wall p50 (ms)": percentile(waits, 0.5) * 1e3,
    }


async def main(report: Report, rounds: int, warmup: int, per_block: int) -> None:
    backend = ProcessBackend(ProcessBackendConfig())
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        breakdowns: list[dict[str, float]] = []

        async def one_block() -> float:
            breakdown = await block(engine, backend, per_block, 4)
            breakdowns.append(breakdown)
            return breakdown["executions/s"]

        rates = await interleave(
            {"print(1) c=4": one_block}, rounds, warmup=warmup, before=backend.pool.wait_ready
        )
        # One case, one run per block: the harness ran the warm-up blocks first and kept the
        # rates of the rest, which are the breakdowns after the warm-up's.
        timed = breakdowns[warmup:]
        assert [b["executions/s"] for b in timed] == rates["print(1) c=4"]
        report.section(f"print(1) at concurrency 4: medians of {rounds} blocks of {per_block}")
        for name in timed[0]:
            values = [b[name] for b in timed]
            unit = "" if name in UNITLESS else "ms per execution"
            report.figure(name, percentile(values, 0.5), unit, fmt=".2f")
            report.data(f"{name} samples", values)
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=3, warmup=1)
    parser.add_argument("--per-block", type=int, default=600, help="executions per block")
    args = parser.parse_args()
    with Report("forkserver_cost", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.per_block))
