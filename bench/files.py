"""Files benchmark: what 1 MiB in and 1 MiB out cost beside a plain ``print(1)``.

Run: ``python -m bench.files [--rounds N] [--backend process|docker]``. Two cases run interleaved
through the embedded `Engine` with a warm pool (full and idle before every timed run, like
`bench.sandbox`), in the same run:

- ``print(1)``: the baseline, no files;
- ``1 MiB in + 1 MiB out``: one 1 MiB binary input file, read by the script and written back
  reversed under outputs/; the result carries it with its sha256 (checked every run).

Printed: p50/p95 of both, the difference of the p50s (what the two files cost: base64 in the job
frame, the guest's write and walk, chunked frames back, the host's sha256) and the ratio.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.base import Backend
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.files import InputFile

MIB = 1 << 20
DATA = bytes(range(256)) * (MIB // 256)
REVERSED_SHA = hashlib.sha256(DATA[::-1]).hexdigest()
FILES_SCRIPT = "open('outputs/out.bin', 'wb').write(open('in.bin', 'rb').read()[::-1])"


def _backend(name: str, pool: int) -> Backend:
    if name == "docker":
        from sandbox.backends.docker.backend import DockerBackend, DockerBackendConfig

        return DockerBackend(DockerBackendConfig(pool_size=pool))
    from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig

    return ProcessBackend(ProcessBackendConfig(pool_size=pool))


async def main(report: Report, rounds: int, warmup: int, backend_name: str, pool: int) -> None:
    backend: Any = _backend(backend_name, pool)
    engine = Engine(EngineConfig(backends={backend_name: backend}, default_backend=backend_name))
    await engine.start()
    try:
        await backend.pool.wait_ready()

        async def quiet() -> None:
            await backend.pool.wait_ready()
            await asyncio.sleep(0.02)

        async def plain() -> None:
            result = await engine.execute(ExecutionRequest("print(1)"))
            assert result.stdout == "1\n", result.to_json(content=False)

        async def files() -> None:
            request = ExecutionRequest(FILES_SCRIPT, files=(InputFile("in.bin", DATA),))
            result = await engine.execute(request)
            [output] = result.output_files
            assert output.sha256 == REVERSED_SHA, result.to_json(content=False)
            assert hashlib.sha256(output.data).hexdigest() == REVERSED_SHA

        report.section(f"1 MiB in + 1 MiB out vs print(1), {backend_name} backend, pool {pool}")
        times = await interleave(
            {"print(1)": plain, "1 MiB in + 1 MiB out": files},
            rounds,
            warmup=warmup,
            before=quiet,
        )
        for label, values in times.items():
            report.timings(label, values)
        base = percentile(times["print(1)"], 0.5)
        with_files = percentile(times["1 MiB in + 1 MiB out"], 0.5)
        report.figure("files cost (p50 difference)", (with_files - base) * 1000, "ms")
        report.figure("ratio p50", with_files / base, "x")
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=30)
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument("--pool", type=int, default=2)
    args = parser.parse_args()
    with Report("files", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.backend, args.pool))
