"""Where the host's CPU per execution goes: the embedded engine's event-loop thread, profiled.

Run: ``python -m bench.host_profile [--executions N] [--concurrency C] [--loop uvloop]
[--profile [--profile-out FILE]]`` as root (cgroups, like the process backend). Runs
``print(1)`` through the `Engine` N times at concurrency C and prints the CPU per execution
of the event loop's thread (`time.thread_time`, which a worker or channel thread does not add
to) and of the whole host process, per block, in ``--rounds`` blocks. With ``--profile`` the
last block runs under cProfile timed by the loop thread's own CPU clock (so a syscall that
waits, or a moment the thread is off its CPU, counts nothing) and prints that CPU by module,
then the functions with the most of it; ``--profile-out`` keeps its `pstats` file. Profiling
slows Python code several times over and syscalls not at all, so read its shares as where to
look, not as the cost.

What it is for: comparing two versions of the host, in alternating runs (the machine is shared
and noisy: a difference under ~0.3 ms between single runs is noise). `bench.forkserver` is the
benchmark against the isolation floor.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import os
import pstats
import time

from bench.harness import Report, bench_parser, run_in_slots
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest


def _module(filename: str, function: str) -> str:
    if "/sandbox/" in filename:
        return "sandbox/" + filename.split("/sandbox/", 1)[1]
    if "/asyncio/" in filename:
        return "asyncio/" + filename.rsplit("/", 1)[1]
    if filename == "~":
        return function  # a builtin: the syscall or C function itself
    return filename.rsplit("/", 1)[-1]


def print_profile(profile: cProfile.Profile | str, top: int = 25) -> None:
    """Prints a profile's CPU by module and its costliest functions (``profile``: a profiler,
    or the path of its dumped stats)."""
    stats = pstats.Stats(profile)
    by_module: collections.Counter[str] = collections.Counter()
    for (filename, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        by_module[_module(filename, function)] += row[2]  # its own time
    total = sum(by_module.values()) or 1.0
    print("loop thread CPU under the profiler, by module (own time):")
    for name, seconds in by_module.most_common(top):
        print(f"  {seconds / total * 100:5.1f}%  {name}")
    stats.sort_stats("cumulative").print_stats(top)


async def block(engine: Engine, executions: int, concurrency: int) -> tuple[float, float]:
    """(loop thread CPU, process CPU) per execution, in ms."""

    async def one() -> None:
        result = await engine.execute(ExecutionRequest("print(1)"))
        assert result.stdout == "1\n", result

    thread0, process0 = time.thread_time(), time.process_time()
    await run_in_slots(one, executions, concurrency)
    thread1, process1 = time.thread_time(), time.process_time()
    return (thread1 - thread0) / executions * 1e3, (process1 - process0) / executions * 1e3


async def main(
    report: Report,
    rounds: int,
    warmup: int,
    executions: int,
    concurrency: int,
    profile: bool,
    profile_out: str | None = None,
) -> None:
    backend = ProcessBackend(ProcessBackendConfig())
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        await backend.pool.wait_ready()
        for _ in range(warmup):
            await block(engine, executions, concurrency)
        threads, processes = [], []
        for _ in range(rounds):
            thread_ms, process_ms = await block(engine, executions, concurrency)
            threads.append(thread_ms)
            processes.append(process_ms)
        report.section(f"print(1) x {executions} at concurrency {concurrency}, {rounds} blocks")
        report.figure("loop thread CPU / execution, median", sorted(threads)[rounds // 2], "ms")
        report.figure("host process CPU / execution, median", sorted(processes)[rounds // 2], "ms")
        report.data("loop thread ms per block", threads)
        report.data("host process ms per block", processes)
        if profile:
            profiler = cProfile.Profile(time.thread_time)
            profiler.enable()
            await block(engine, executions, concurrency)
            profiler.disable()
            print_profile(profiler)
            if profile_out:
                profiler.dump_stats(profile_out)
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=3, warmup=1)
    parser.add_argument("--executions", type=int, default=200, help="executions per block")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--profile", action="store_true", help="profile one more block")
    parser.add_argument("--profile-out", metavar="FILE", help="keep the profile's pstats here")
    args = parser.parse_args()
    if args.loop == "uvloop":
        os.environ["PTC_EVENT_LOOP"] = "uvloop"
    from sandbox.eventloop import new_event_loop

    factory = new_event_loop if args.loop == "uvloop" else asyncio.new_event_loop
    with Report("host_profile", args) as report, asyncio.Runner(loop_factory=factory) as runner:
        runner.run(
            main(
                report,
                args.rounds,
                args.warmup,
                args.executions,
                args.concurrency,
                args.profile,
                args.profile_out,
            )
        )
