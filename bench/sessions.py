"""Sessions benchmark: an execution in a session beside a single-use one, in the same run.

Run: ``python -m bench.sessions [--rounds N] [--backend process|docker]``. A `SandboxServer` runs
in this process on the chosen backend; a client on the same event loop calls it over loopback
gRPC. Two cases, interleaved run by run (`bench.harness`):

- ``session x += 1``: ``x += 1; print(x)`` sent to one open session (every timed run is at least
  the session's second execution: the first, ``x = 0``, runs before the warm-up);
- ``single-use print(1)``: the unary Execute of ``print(1)`` in a fresh sandbox from the pool.

Before every run the pool is full and idle (waited for, untimed), so neither case pays for a
refill the other caused. Printed: p50/p95 of each and the ratio of the p50s (target < 1: a
session's cell skips the sandbox hand-over, the cgroup set-up and the teardown); then the same
two cases on the server's engine directly (no gRPC, no audit), what a cell itself costs.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import sandbox  # noqa: F401  first: it configures gRPC's fork handling (see its __init__)

# isort: split
from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.client import AsyncClient
from sandbox.engine import ExecutionRequest
from sandbox.server import SandboxServer, ServerConfig
from sandbox.sessions import SessionSandbox

PACE_S = 0.05


async def main(report: Report, rounds: int, warmup: int, backend: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = SandboxServer(
            ServerConfig(
                listen="127.0.0.1:0",
                pool_size=2,
                audit_db=str(Path(tmp) / "audit.db"),
                docker=backend == "docker",
            )
        )
        address = await server.start()
        pool = server.engine.config.backends[backend].pool
        assert pool is not None, f"{backend} keeps a warm pool"
        try:
            async with (
                AsyncClient(address) as client,
                client.session(backend=backend) as session,
            ):
                first = await session.execute("x = 0")
                assert first.status == "ok", first

                async def in_session() -> None:
                    result = await session.execute("x += 1\nprint(x)")
                    assert result.status == "ok", result

                async def single_use() -> None:
                    result = await client.execute("print(1)", backend=backend)
                    assert result.status == "ok", result

                async def settle() -> None:
                    await pool.wait_ready()
                    await asyncio.sleep(PACE_S)

                report.section(f"1. one execution through gRPC on the {backend} backend")
                times = await interleave(
                    {"session x += 1": in_session, "single-use print(1)": single_use},
                    rounds,
                    warmup=warmup,
                    before=settle,
                )
                for label, values in times.items():
                    report.timings(label, values)
                ratio = percentile(times["session x += 1"], 0.5) / percentile(
                    times["single-use print(1)"], 0.5
                )
                report.figure("session / single-use p50", ratio, "x", note="target < 1")
                await embedded(report, server, rounds, warmup, backend, settle)
        finally:
            await server.stop(grace_s=1.0)


async def embedded(
    report: Report,
    server: SandboxServer,
    rounds: int,
    warmup: int,
    backend: str,
    settle: Callable[[], Awaitable[None]],
) -> None:
    """The same two cases on the server's engine, without gRPC: what a cell itself costs."""
    engine = server.engine
    first = engine.prepare(ExecutionRequest("x = 0", backend=backend))
    handle = await engine.backend(backend).acquire(first.limits)
    await handle.apply_limits(first.limits)
    cell = SessionSandbox(handle, first.limits.cpu_time_ms)
    try:
        assert (await engine.run(first, session=cell)).status == "ok"

        async def in_session() -> None:
            prepared = engine.prepare(ExecutionRequest("x += 1\nprint(x)", backend=backend))
            result = await engine.run(prepared, session=cell)
            assert result.status == "ok", result

        async def single_use() -> None:
            result = await engine.execute(ExecutionRequest("print(1)", backend=backend))
            assert result.status == "ok", result

        report.section(f"2. the same, embedded (Engine.run, no gRPC, no audit) on {backend}")
        times = await interleave(
            {"session x += 1": in_session, "single-use print(1)": single_use},
            rounds,
            warmup=warmup,
            before=settle,
        )
        for label, values in times.items():
            report.timings(label, values)
        ratio = percentile(times["session x += 1"], 0.5) / percentile(
            times["single-use print(1)"], 0.5
        )
        report.figure("session / single-use p50", ratio, "x", note="target < 1")
    finally:
        await cell.dispose()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=40)
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    args = parser.parse_args()
    with Report("sessions", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.backend))
