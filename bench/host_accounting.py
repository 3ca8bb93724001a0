"""The cost of host accounting: the degraded process backend summing every sandbox's processes
from /proc (`sandbox/backends/process/host_meter.py`) against the same backend without it.

Run: ``python -m bench.host_accounting [--rounds N] [--per-block N] [--concurrency 4]``. Two
engines, each a process backend with cgroups turned off (the degraded mode of the Kubernetes
base), one with ``host_accounting`` (the default there) and one without (rlimits alone), run
interleaved block by block in the same run (`bench.harness`). A block runs ``--per-block``
executions at ``--concurrency`` and its sample is executions per second. Two scripts:

1. ``print(1)``: shorter than the sampling period, so only the read at the sandbox's end;
2. 0.2 s of CPU in the script: about four samples of its processes while it runs.

Printed: p50/p95 executions/s of each, and the cost, 1 - accounted / plain of the p50s (the
issue's target: at most 5% at concurrency 4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bench.harness import Report, bench_parser, interleave, percentile, rate_in_slots
from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

SCRIPTS = {
    "print(1)": "print(1)",
    "0.2 s of CPU": (
        "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end:\n"
        "    pass\nprint(1)"
    ),
}


def _engine(host_accounting: bool, concurrency: int) -> tuple[Engine, ProcessBackend]:
    config = ProcessBackendConfig(
        pool_size=concurrency,
        allow_degraded=True,
        cgroups=False,
        host_accounting=host_accounting,
    )
    backend = build_backend("process", config)
    assert isinstance(backend, ProcessBackend)
    return Engine(EngineConfig(backends={"process": backend})), backend


def _case(
    engine: Engine, script: str, per_block: int, concurrency: int, accounted: bool
) -> Callable[[], Awaitable[float]]:
    request = ExecutionRequest(script=script, manifest="[]")

    async def one() -> None:
        result = await engine.execute(request)
        assert result.status == "ok" and not result.violations, result.to_json()
        # The case measures what it says: host accounting on, or off.
        assert ("host:accounting" in result.isolation) is accounted, result.isolation

    return lambda: rate_in_slots(one, per_block, concurrency)


async def main(report: Report, rounds: int, warmup: int, per_block: int, concurrency: int) -> None:
    accounted, accounted_backend = _engine(True, concurrency)
    plain, plain_backend = _engine(False, concurrency)
    await accounted.start()
    await plain.start()

    async def refilled() -> None:
        await accounted_backend.pool.wait_ready()
        await plain_backend.pool.wait_ready()

    try:
        for number, (name, script) in enumerate(SCRIPTS.items(), 1):
            report.section(f"{number}. {name}, {per_block} per block at concurrency {concurrency}")
            labels = ("host accounting", "rlimits alone")
            rates = await interleave(
                {
                    labels[0]: _case(accounted, script, per_block, concurrency, True),
                    labels[1]: _case(plain, script, per_block, concurrency, False),
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
            report.figure("cost, 1 - accounted/plain at p50", cost * 100, "%", note="target <= 5%")
    finally:
        await accounted.close()
        await plain.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--per-block", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with Report("host_accounting", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.per_block, args.concurrency))
