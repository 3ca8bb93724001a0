"""Docker backend benchmark: warm-pool latency against `docker run`, and throughput.

Run: ``python -m bench.docker`` with an engine (``eval "$(scripts/dockerd.sh start)"``) and the
runtime image (``scripts/build_images.sh``). Printed, all measured in this one run:

- latency of ``print(1)`` end to end through the engine API (`Engine.execute`) with a container
  already waiting in the warm pool (the pool refills between samples), p50 and p95;
- latency of ``docker run --rm --network none IMAGE python3 -c 'print(1)'``, p50 and p95, and
  the ratio of the two p50s (target: the pool at least 20x faster);
- executions per second at concurrency 8 while the pool refills, next to the engine's own
  container start rate (create, start, wait, remove of ``python3 -c pass``, 8 at a time): a
  single-use container per execution cannot go faster than the engine starts containers.

Options: ``--samples N`` (latency samples, default 40), ``--runs N`` (``docker run`` samples,
default 10), ``--burst N`` (executions in the throughput test, default 48).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from sandbox.backends.docker import engine_client
from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

CONCURRENCY = 8


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def docker_cli() -> str:
    # Debian's CLI matches the engine here; another one on PATH may be of another version.
    return (
        "/usr/bin/docker"
        if os.access("/usr/bin/docker", os.X_OK)
        else shutil.which("docker") or "docker"
    )


def docker_run_latency(image: str, runs: int) -> list[float]:
    argv = [docker_cli(), "-H", engine_client.engine_address(), "run", "--rm", "--network", "none"]
    argv += [image, "python3", "-c", "print(1)"]
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        out.append(time.perf_counter() - started)
        if proc.stdout != "1\n":
            raise SystemExit(f"docker run failed: {proc.stderr.strip()}")
    return out


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


async def warm_latency(engine: Engine, backend: DockerBackend, samples: int) -> list[float]:
    request = ExecutionRequest(script="print(1)", backend="docker")
    out = []
    for _ in range(samples):
        await backend.pool.wait_ready(60)
        while backend._removals:  # let the last container's removal finish: quiet machine
            await asyncio.sleep(0.005)
        started = time.perf_counter()
        result = await engine.execute(request)
        out.append(time.perf_counter() - started)
        if result.stdout != "1\n":
            raise SystemExit(f"unexpected result: {result.to_json()}")
    return out


async def throughput(engine: Engine, backend: DockerBackend, burst: int) -> float:
    await backend.pool.wait_ready(120)
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


async def pooled(samples: int, burst: int) -> tuple[list[float], float]:
    backend = DockerBackend(DockerBackendConfig(pool_size=CONCURRENCY, max_starting=2))
    async with Engine(
        EngineConfig(backends={"docker": backend}, default_backend="docker")
    ) as engine:
        if backend.unavailable_reason:
            raise SystemExit(backend.unavailable_reason)
        latencies = await warm_latency(engine, backend, samples)
        rate = await throughput(engine, backend, burst)
    return latencies, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burst", type=int, default=48)
    args = parser.parse_args()
    image = engine_client.default_image()
    print(f"engine {engine_client.engine_address()}, image {image}")

    latencies, rate = asyncio.run(pooled(args.samples, args.burst))
    runs = docker_run_latency(image, args.runs)
    starts = engine_start_rate(image, max(16, args.burst // 2))

    warm_p50, run_p50 = statistics.median(latencies), statistics.median(runs)
    for label, values in (("warm pool print(1)  ", latencies), ("docker run print(1) ", runs)):
        p50, p95 = statistics.median(values) * 1000, pct(values, 0.95) * 1000
        print(f"{label} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  (n={len(values)})")
    print(f"speed-up (p50)       {run_p50 / warm_p50:7.1f}x  (target >= 20x)")
    print(f"throughput, concurrency {CONCURRENCY}, pool refilling: {rate:6.1f} executions/s")
    print(f"engine container start rate, {CONCURRENCY} at a time:   {starts:6.1f} containers/s")


if __name__ == "__main__":
    main()
