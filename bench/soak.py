"""Soak: many executions through a real ``ptc serve``, and what the server holds before and after.

Run: ``python -m bench.soak [--total 10000] [--concurrency 32]`` as root. Starts ``ptc serve``
on a loopback port (its own SQLite audit file in a temporary directory), runs ``print(1)``
``--total`` times at ``--concurrency`` through the async client, checks every result is ok with
the right output, and prints the server's open descriptors, threads, cgroups, processes and RSS
before and after (after a first, uncounted burst at the same concurrency, which grows what is
bounded but grown on demand, and a pause for the pool to settle): nothing may grow beyond the
pool's size. Exits non-zero if an execution failed or something grew.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import psutil

from bench.grpc import spawn, stop
from bench.harness import Report, bench_parser
from sandbox.client import AsyncClient

SETTLE_S = 3.0
WARM_UP_PER_SLOT = 4
POOL_MAX_IDLE = 8  # ProcessBackendConfig.pool_max_idle: idle sandboxes the pool may keep


def holdings(pid: int) -> dict[str, int]:
    server = psutil.Process(pid)
    cgroups = set()  # one per sandbox, whatever the number of v1 hierarchies
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        cgroups |= {p.parent.name for p in hierarchy.glob(f"**/ptc-{pid}-*/*/cgroup.procs")}
    return {
        "open fds": server.num_fds(),
        "threads": server.num_threads(),
        "sandbox cgroups": len(cgroups),
        "descendant processes": len(server.children(recursive=True)),
        "RSS MiB": server.memory_info().rss // 2**20,
    }


async def soak(report: Report, address: str, pid: int, total: int, concurrency: int) -> bool:
    async with AsyncClient(address) as client:
        slots = asyncio.Semaphore(concurrency)
        failures: list[str] = []

        async def one() -> None:
            async with slots:
                result = await client.execute("print(1)")
                if result.status != "ok" or result.stdout != "1\n":
                    failures.append(f"{result.status} {result.stdout!r} {result.stderr[-200:]!r}")

        # A first burst at the same concurrency, not counted: what is bounded but grown on
        # demand (the pool up to its maximum, the event loop's worker threads, gRPC's) has
        # grown before the "before" figures, so that growth after the soak means a leak.
        await asyncio.gather(*(one() for _ in range(WARM_UP_PER_SLOT * concurrency)))
        await asyncio.sleep(SETTLE_S)
        before = holdings(pid)
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        elapsed = time.perf_counter() - started
        await asyncio.sleep(SETTLE_S)
        after = holdings(pid)
    report.figure("executions", total, "", fmt=".0f")
    report.figure("failed", len(failures), "", fmt=".0f", note="must be 0")
    report.figure("sustained rate", total / elapsed, "executions/s", fmt=".1f")
    grew = []
    for key in before:
        report.print(f"   {key:<22} before {before[key]:>6}  after {after[key]:>6}")
        report.data(f"{key} before/after", [before[key], after[key]])
        # Idle sandboxes may have grown to the pool's maximum: 2 processes, 1 cgroup, and the
        # host side (a channel thread, 4 descriptors) each.
        allowance = {"descendant processes": 2, "sandbox cgroups": 1, "threads": 1}
        allowed = allowance.get(key, 5) * POOL_MAX_IDLE
        if key == "RSS MiB":
            allowed = 20  # allocator arenas settle after a burst of 32 concurrent executions
        if after[key] - before[key] > allowed:
            grew.append(f"{key} grew from {before[key]} to {after[key]}")
    for line in failures[:5] + grew:
        report.print(f"   PROBLEM: {line}")
    return not failures and not grew


def main() -> None:
    parser = bench_parser(__doc__, rounds=1, warmup=0)
    parser.add_argument("--total", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptc-soak-") as audit_dir:
        proc, address = spawn(
            ["-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0",
             "--audit-db", f"{audit_dir}/audit.db"]
        )  # fmt: skip
        try:
            with Report("soak", args) as report:
                report.section(f"{args.total} x print(1) at concurrency {args.concurrency}")
                ok = asyncio.run(soak(report, address, proc.pid, args.total, args.concurrency))
        finally:
            stop(proc)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
