"""Docker backend benchmark: warm-pool latency against `docker run`, and throughput.

Run: ``python -m bench.docker`` with an engine (``eval "$(scripts/dockerd.sh start)"``) and the
runtime image (``scripts/build_images.sh``). Printed, all measured in this one run, each pair
interleaved block by block (`bench.harness`):

- latency of ``print(1)`` end to end through the engine API (`Engine.execute`) with a container
  already waiting in the warm pool (the pool is full and no removal runs before each sample),
  against ``docker run --rm --network none IMAGE python3 -c 'print(1)'`` in the same blocks,
  p50 and p95, and the ratio of the two p50s (target: the pool at least 20x faster);
- executions per second at concurrency 8 while the pool refills, interleaved with the engine's
  own container start rate (create, start, wait, remove of ``python3 -c pass``, 8 at a time): a
  single-use container per execution cannot go faster than the engine starts containers.

Options: ``--rounds N`` (latency blocks, default 10), ``--blocks N`` (throughput blocks, default
2), ``--burst N`` (executions per throughput block, default 24), ``--warmup``, ``--json-out``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.docker import engine_client
from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

CONCURRENCY = 8


def docker_cli() -> str:
    # Debian's CLI matches the engine here; another one on PATH may be of another version.
    return (
        "/usr/bin/docker"
        if os.access("/usr/bin/docker", os.X_OK)
        else shutil.which("docker") or "docker"
    )


def docker_run(image: str) -> None:
    argv = [docker_cli(), "-H", engine_client.engine_address(), "run", "--rm", "--network", "none"]
    proc = subprocess.run(
        [*argv, image, "python3", "-c", "print(1)"], capture_output=True, text=True, check=False
    )
    if proc.stdout != "1\n":
        raise SystemExit(f"docker run failed: {proc.stderr.strip()}")


def engine_start_rate(image: str, count: int) -> float:
    client = engine_client.connect(engine_client.engine_address())

    def one(_: int) -> None:
        container = client.containers.create(
            image, ["python3", "-c", "pass"], network_mode="none", init=True,
            labels={"org.ptc-sandbox.bench": "1"},
        )  # fmt: skip
        try:
            container.start()
            container.wait()
        finally:
            container.remove(force=True)

    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, range(count)))
    elapsed = time.perf_counter() - started
    client.close()
    return count / elapsed


async def pooled_print(engine: Engine) -> None:
    result = await engine.execute(ExecutionRequest(script="print(1)", backend="docker"))
    if result.stdout != "1\n":
        raise SystemExit(f"unexpected result: {result.to_json()}")


async def quiet_pool(backend: DockerBackend) -> None:
    """A full pool and no container removal under way: what a warm request meets."""
    await backend.pool.wait_ready(120)
    while backend._removals:
        await asyncio.sleep(0.005)


async def throughput(engine: Engine, backend: DockerBackend, burst: int) -> float:
    """Executions per second of ``burst`` runs at concurrency 8, from a full pool."""
    request = ExecutionRequest(script="print(1)", backend="docker")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(burst):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            queue.get_nowait()
            result = await engine.execute(request)
            if result.status != "ok":
                raise SystemExit(f"unexpected result: {result.to_json()}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return burst / (time.perf_counter() - started)


async def main(report: Report, rounds: int, warmup: int, blocks: int, burst: int) -> None:
    image = engine_client.default_image()
    report.print(f"engine {engine_client.engine_address()}, image {image}")
    backend = DockerBackend(DockerBackendConfig(pool_size=CONCURRENCY, max_starting=2))
    async with Engine(
        EngineConfig(backends={"docker": backend}, default_backend="docker")
    ) as engine:
        if backend.unavailable_reason:
            raise SystemExit(backend.unavailable_reason)
        report.section("print(1), end to end (interleaved blocks)")
        latency = await interleave(
            {
                "warm pool print(1)": lambda: pooled_print(engine),
                # Blocking on purpose: nothing else may run while it is timed. The pool refills
                # (untimed) before the next warm sample.
                "docker run print(1)": lambda: docker_run(image),
            },
            rounds,
            warmup=warmup,
            before=lambda: quiet_pool(backend),
        )
        for label, values in latency.items():
            report.timings(label, values)
        warm_p50 = percentile(latency["warm pool print(1)"], 0.5)
        run_p50 = percentile(latency["docker run print(1)"], 0.5)
        report.figure("speed-up (p50)", run_p50 / warm_p50, "x", "target >= 20x", ".1f")

        report.section(f"rates at concurrency {CONCURRENCY} (interleaved blocks)")
        starts = max(16, burst // 2)
        rates = await interleave(
            {
                "executions/s, pool refilling": lambda: throughput(engine, backend, burst),
                "engine container starts/s": lambda: asyncio.to_thread(
                    engine_start_rate, image, starts
                ),
            },
            blocks,
            warmup=0,
            before=lambda: quiet_pool(backend),
        )
        for label, values in rates.items():
            report.figure(label, percentile(values, 0.5), "/s", f"median of {len(values)}", ".1f")


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--blocks", type=int, default=2, help="throughput blocks")
    parser.add_argument("--burst", type=int, default=24, help="executions per throughput block")
    args = parser.parse_args()
    with Report("docker", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.blocks, args.burst))
