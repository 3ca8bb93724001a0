"""The cost of one uid per sandbox (`sandbox/backends/process/uid_range.py`): the degraded process
backend giving each sandbox a uid of its own against the same backend with one uid for all.

Run (as root, which has a range to give): ``python -m bench.uid_per_sandbox [--rounds N]
[--per-block N] [--concurrency 4]``. Two engines, each a process backend with cgroups turned off
(where RLIMIT_NPROC is the only bound on processes), one with the default range and one with
``sandbox_uid_count=0``, run ``print(1)`` interleaved block by block in the same run
(`bench.harness`); a block's sample is executions per second. What a uid costs a sandbox: a
take and a give-back in the pool, 10 more bytes with its go-ahead, and four system calls in its
pid 1 (setgroups, setresgid, setresuid, prctl); the zygote's start pays one helper process that
writes the map, which this does not measure (a zygote starts once per 2000 forks or 600 s).

Printed: p50/p95 executions/s of each, and the cost, 1 - own / shared of the p50s.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from bench.harness import Report, bench_parser, interleave, percentile, rate_in_slots
from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest


def _engine(own_uid: bool, concurrency: int) -> tuple[Engine, ProcessBackend]:
    config = ProcessBackendConfig(pool_size=concurrency, allow_degraded=True, cgroups=False)
    if not own_uid:
        config = dataclasses.replace(config, sandbox_uid_count=0)
    backend = build_backend("process", config)
    assert isinstance(backend, ProcessBackend)
    return Engine(EngineConfig(backends={"process": backend})), backend


def _case(
    engine: Engine, per_block: int, concurrency: int, own_uid: bool
) -> Callable[[], Awaitable[float]]:
    request = ExecutionRequest(script="print(1)", manifest="[]")
    mechanism = "limit:processes=rlimit" if own_uid else "limit:processes=rlimit-shared"

    async def one() -> None:
        result = await engine.execute(request)
        assert result.status == "ok" and not result.violations, result.to_json()
        assert mechanism in result.isolation, result.isolation  # it measures what it says

    return lambda: rate_in_slots(one, per_block, concurrency)


async def main(report: Report, rounds: int, warmup: int, per_block: int, concurrency: int) -> None:
    own, own_backend = _engine(True, concurrency)
    shared, shared_backend = _engine(False, concurrency)
    await own.start()
    await shared.start()
    if own_backend.uids is None:
        raise SystemExit("this host has no range of uids to give (run as root)")

    async def refilled() -> None:
        await own_backend.pool.wait_ready()
        await shared_backend.pool.wait_ready()

    try:
        report.section(f"print(1), {per_block} per block at concurrency {concurrency}")
        labels = ("a uid per sandbox", "one uid for all")
        rates = await interleave(
            {
                labels[0]: _case(own, per_block, concurrency, True),
                labels[1]: _case(shared, per_block, concurrency, False),
            },
            rounds,
            warmup=warmup,
            before=refilled,
        )
        for label in labels:
            values = rates[label]
            report.figure(f"{label}, p50", percentile(values, 0.5), "exec/s")
            report.figure(f"{label}, p95 (slowest blocks)", percentile(values, 0.05), "exec/s")
        cost = 1 - percentile(rates[labels[0]], 0.5) / percentile(rates[labels[1]], 0.5)
        report.figure("cost, 1 - own/shared at p50", cost * 100, "%")
    finally:
        await own.close()
        await shared.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--per-block", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with Report("uid_per_sandbox", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.per_block, args.concurrency))
