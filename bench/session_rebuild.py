"""Session rebuild benchmark: the time and CPU to rebuild a session of 10 and of 100 cells.

Run: ``python -m bench.session_rebuild [--rounds N] [--backend process|docker]``. Embedded: a
`SandboxServer` with a SQLite audit store runs in this process; a client on the same event loop
builds two sessions over loopback gRPC, of 10 and of 100 recorded cells (each cell sets a
variable and prints it; every tenth also calls an echo tool, answered from the record when
replayed). A timed run is one rebuild, as a session's next call on another server does it
(`SessionManager.resume` → `sandbox.sessions.rebuild`): the session is let go of as a draining
server does (its sandbox disposed, its record handed over in the store), untimed, then taken
over and rebuilt: the cells read from the store, a fresh sandbox, every cell replayed and
checked. No gRPC in the timed part; a rebuild through another server adds one call's cost.

Printed, the two sizes interleaved run by run (`bench.harness`): the wall time p50/p95 of each,
the CPU of the server process and of the sandbox per rebuild (p50), and the wall time per cell.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import sandbox  # noqa: F401  first: it configures gRPC's fork handling (see its __init__)

# isort: split
from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.client import AsyncClient
from sandbox.server import SandboxServer, ServerConfig
from sandbox.sessions.rebuild import RebuildBounds

TOOLS = [
    {"name": "lookup", "parameters": {"type": "object", "properties": {"k": {"type": "integer"}}}}
]
BOUNDS = RebuildBounds(max_cells=1000, max_cpu_s=600)


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
        manager = server.runner.sessions
        store: Any = server.runner.store
        pool: Any = server.engine.config.backends[backend].pool
        try:
            sizes = (10, 100)
            ids: dict[int, str] = {}
            async with AsyncClient(address) as client:
                for size in sizes:
                    session = client.session(TOOLS, backend=backend)
                    await session.create()
                    for i in range(size):
                        call = f"\nimport tools\ntools.lookup(k={i})" if i % 10 == 9 else ""
                        done = await session.execute(f"x{i} = {i}\nprint(x{i}){call}")
                        assert done.status == "ok", done
                    ids[size] = session.id
            tenant = manager._sessions[ids[10]].tenant
            cpu: dict[int, list[float]] = {size: [] for size in sizes}
            sandbox_cpu: dict[int, list[float]] = {size: [] for size in sizes}

            async def let_go(session_id: str) -> None:
                held = manager._sessions.pop(session_id)
                await held.sandbox.dispose()
                assert await asyncio.to_thread(store.hand_over, session_id, "bench")

            def case(size: int) -> Any:
                async def rebuild() -> float:
                    await let_go(ids[size])
                    await pool.wait_ready()
                    cpu_before, started = time.process_time(), time.perf_counter()
                    session = await manager.resume(tenant, ids[size], BOUNDS)
                    elapsed = time.perf_counter() - started
                    cpu[size].append(time.process_time() - cpu_before)
                    sandbox_cpu[size].append(session.sandbox.handle.usage().cpu_time_s)
                    assert len(session.executions) == size
                    return elapsed

                return rebuild

            report.section(f"1. rebuild a session (take-over, replay, verify) on {backend}")
            times = await interleave(
                {f"{size} cells": case(size) for size in sizes}, rounds, warmup=warmup
            )
            for size in sizes:
                values = times[f"{size} cells"]
                report.timings(f"{size} cells: wall time", values)
                cpu_s = cpu[size][warmup:] if len(cpu[size]) > len(values) else cpu[size]
                box_s = sandbox_cpu[size][-len(values) :]
                report.figure(f"{size} cells: server CPU p50", percentile(cpu_s, 0.5) * 1000, "ms")
                report.figure(f"{size} cells: sandbox CPU p50", percentile(box_s, 0.5) * 1000, "ms")
                report.figure(
                    f"{size} cells: wall time per cell", percentile(values, 0.5) / size * 1000, "ms"
                )
        finally:
            await server.stop(grace_s=1.0)


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=5)
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    args = parser.parse_args()
    with Report("session_rebuild", args) as report:
        asyncio.run(main(report, args.rounds, args.warmup, args.backend))
