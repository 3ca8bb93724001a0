"""Runtimes and the gVisor tier: runc against runsc, and numpy's import with and without preload.

Run: ``python -m bench.runtimes``. Printed, each pair measured in this one run, interleaved
block by block (`bench.harness`):

1. ``print(1)`` end to end through `Engine.execute` from a warm pool, on the Docker backend under
   runc and under runsc (gVisor), p50 and p95, and the ratio of the p50s; then executions per
   second at concurrency 4 for both (sustained: bursts that outrun the pool, so container starts
   count). Skipped, with the reason, where no engine, image or registered runsc is there.
2. On the process backend, ``import numpy`` as the script times it (``time.perf_counter`` around
   the import), in a runtime whose fork server preloaded numpy against one that did not (both
   built here, from the package index, into a temporary directory), and the end-to-end p50 of
   the same execution.

Options: ``--rounds N`` (default 10), ``--blocks N`` (rate blocks, default 2), ``--burst N``
(executions per rate block, default 12), ``--warmup``, ``--json-out``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.factory import BackendOptions, build_backend
from sandbox.backends.process.backend import (
    ProcessBackend,
    ProcessBackendConfig,
    default_guest_python,
)
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.errors import Unavailable
from sandbox.runtimes import RuntimeStore, build_runtime

CONCURRENCY = 4
IMPORT_SCRIPT = (
    "import time\nt = time.perf_counter()\nimport numpy\nprint(time.perf_counter() - t)\n"
)


async def _print1(engine: Engine, backend: str) -> None:
    result = await engine.execute(ExecutionRequest(script="print(1)", backend=backend))
    if result.stdout != "1\n":
        raise SystemExit(f"unexpected result on {backend}: {result.to_json()}")


async def _rate(engine: Engine, backend: str, burst: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(burst):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            queue.get_nowait()
            await _print1(engine, backend)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return burst / (time.perf_counter() - started)


async def docker_tiers(report: Report, rounds: int, warmup: int, blocks: int, burst: int) -> None:
    try:
        from sandbox.backends.docker import engine_client

        runc = build_backend("docker", BackendOptions(pool_size=2))
        runsc = build_backend("gvisor", BackendOptions(pool_size=2))
    except Unavailable as exc:
        report.print(f"skipped: {exc.message}")
        return
    engine = Engine(EngineConfig(backends={"docker": runc, "gvisor": runsc}))
    async with engine:
        for backend in (runc, runsc):
            if backend.unavailable_reason:
                report.print(f"skipped: {backend.name}: {backend.unavailable_reason}")
                return
        report.print(f"engine {engine_client.engine_address()}, image {runc.image}")
        latency = await interleave(
            {
                "runc print(1)": lambda: _print1(engine, "docker"),
                "runsc print(1)": lambda: _print1(engine, "gvisor"),
            },
            rounds,
            warmup=warmup,
            before=lambda: _quiet(runc, runsc),
        )
        for label, values in latency.items():
            report.timings(label, values)
        ratio = percentile(latency["runsc print(1)"], 0.5) / percentile(
            latency["runc print(1)"], 0.5
        )
        report.figure("runsc / runc (p50)", ratio, "x", "gVisor's cost per execution", ".2f")
        rates = await interleave(
            {
                "runc executions/s": lambda: _rate(engine, "docker", burst),
                "runsc executions/s": lambda: _rate(engine, "gvisor", burst),
            },
            blocks,
            warmup=0,
            before=lambda: _quiet(runc, runsc),
        )
        for label, values in rates.items():
            report.figure(
                label, percentile(values, 0.5), "/s", f"concurrency {CONCURRENCY}, sustained"
            )


async def _quiet(*backends: object) -> None:
    for backend in backends:
        await backend.pool.wait_ready(120)  # type: ignore[attr-defined]


async def preload(report: Report, rounds: int, warmup: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="ptc-bench-runtimes-", dir="/tmp"))
    root.chmod(0o755)
    try:
        requirements = root / "requirements.txt"
        requirements.write_text("numpy\n")
        store = RuntimeStore(root)
        python = default_guest_python()
        started = time.perf_counter()
        await asyncio.to_thread(
            build_runtime, store, "preloaded", requirements, python=python, preload=["numpy"]
        )
        report.figure("build (numpy, from the index)", time.perf_counter() - started, "s")
        await asyncio.to_thread(build_runtime, store, "plain", requirements, python=python)
        backend = ProcessBackend(
            ProcessBackendConfig(pool_size=1, runtimes_dir=str(root), runtime_pool_size=1)
        )
        async with Engine(EngineConfig(backends={"process": backend})) as engine:
            imports: dict[str, list[float]] = {"preloaded": [], "plain": []}

            async def timed_import(runtime: str) -> float:
                request = ExecutionRequest(script=IMPORT_SCRIPT, runtime=runtime)
                result = await engine.execute(request)
                if result.status != "ok":
                    raise SystemExit(f"unexpected result: {result.to_json()}")
                imports[runtime].append(float(result.stdout))
                return result.usage.wall_time_s

            async def settled() -> None:
                assert backend.runtimes is not None
                for env in backend.runtimes.envs.values():
                    await env.pool.wait_ready(60)

            walls = await interleave(
                {
                    "preloaded": lambda: timed_import("preloaded"),
                    "plain": lambda: timed_import("plain"),
                },
                rounds,
                warmup=warmup,
                before=settled,
            )
            for label in ("preloaded", "plain"):
                report.timings(f"import numpy, {label}", imports[label][-rounds:])
            for label, values in walls.items():
                report.timings(f"execution wall (script's own), {label}", values)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main(report: Report, rounds: int, warmup: int, blocks: int, burst: int) -> None:
    report.section("1. print(1) on the Docker backend: runc against runsc (gVisor)")
    await docker_tiers(report, rounds, warmup, blocks, burst)
    report.section("2. import numpy in a runtime: preloaded by its fork server, or not")
    await preload(report, rounds, warmup)


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--burst", type=int, default=12)
    args = parser.parse_args()
    with Report("runtimes", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.blocks, args.burst))
