"""Session rebuild benchmark: the time and CPU to rebuild a session of 10 and of 100 cells, and
how long after the take-over its first replayed cell starts, on a store of any size.

Run: ``python -m bench.session_rebuild [--rounds N] [--backend process|docker] [--history
10000,100000,1000000] [--store PATH | --pg-url URL]``. Embedded: a `SandboxServer` with a SQLite
audit store (or PostgreSQL) runs in this process; a client on the same event loop builds two
sessions over loopback gRPC, of 10 and of 100 recorded cells (each cell sets a variable and
prints it; every tenth also calls an echo tool, answered from the record when replayed). A timed
run is one rebuild, as a session's next call on another server does it (`SessionManager.resume`
→ `sandbox.sessions.rebuild`): the session is let go of as a draining server does (its sandbox
disposed, its record handed over in the store), untimed, then taken over and rebuilt: the cells
read from the store, a fresh sandbox, every cell replayed and checked. No gRPC in the timed
part; a rebuild through another server adds one call's cost. A third case, ``10 cells, dead
holder``, lets go as a dead server does: after the hand-over a second store (``bench-dead``)
takes the session over and its fleet lease runs out, so the rebuild finds the record running
under a holder that is gone (`SessionMoves.take_over` reads the holder's lease: one more
indexed read of the fleet table than after a hand-over).

``--history`` runs the whole at each size: before the server opens the store, the session's
tenant is given that many executions (`bench.scale_history`'s bulk fill: the store's own admission
and completion code, 2,000 a transaction), so the take-over reads and writes a store that big.
``--store`` keeps the SQLite file between runs (filled once, topped up to each size; without
it, a temporary file); ``--pg-url`` runs it all on a fresh schema of that PostgreSQL server
(dropped afterwards).

The take-over's clock points are the code's own (`RebuildClock`, on `time.monotonic`):

- *asked*: a request found no holder of the session on this server and began its rebuild;
- *taken over*: the store's take-over committed (the record's holder is this server, the
  ``taken_over`` entry written): **the take-over instant**;
- *first cell*: the first replayed cell's job frame sent to the sandbox
  (`SessionSandbox.first_job_at`).

Printed, per history size, the two session sizes interleaved run by run (`bench.harness`): the
wall time p50/p95 of each rebuild, the CPU of the server process and of the sandbox per rebuild
(p50), the wall time per cell, and the take-over's three intervals (target: the first cell
within 100 ms of the take-over).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sandbox  # noqa: F401  first: it configures gRPC's fork handling (see its __init__)

# isort: split
from bench.harness import Report, bench_parser, interleave, percentile
from bench.scale_history import fill_bulk
from bench.store_scale import postgres_schema
from sandbox.audit import open_store
from sandbox.client import AsyncClient
from sandbox.server import SandboxServer, ServerConfig
from sandbox.sessions.rebuild import RebuildBounds

TOOLS = [
    {"name": "lookup", "parameters": {"type": "object", "properties": {"k": {"type": "integer"}}}}
]
BOUNDS = RebuildBounds(max_cells=1000, max_cpu_s=600)
TENANT = "default"  # the tenant of a server with no tenants configured
TARGET_MS = 100.0
HANDED, DEAD = "handed over", "dead holder"  # how the session's last holder let go of it


def prefill(path: str, size: int, report: Report) -> None:
    """Tops the store at ``path`` up to ``size`` bulk executions of `TENANT` (ids
    ``default-000000000`` on); what it already holds of them is kept."""
    store = open_store(path, instance="bench-fill")
    try:
        last = store._db.read_one(
            "SELECT execution_id FROM executions WHERE execution_id >= ? AND execution_id < ? "
            "ORDER BY execution_id DESC LIMIT 1",
            (f"{TENANT}-", f"{TENANT}."),
        )
        have = int(str(last[0][0]).rsplit("-", 1)[1]) + 1 if last else 0
        if have < size:
            started = time.perf_counter()
            fill_bulk(store, TENANT, have, size)
            report.print(
                f"filled the store from {have:,} to {size:,} executions of {TENANT!r} in "
                f"{time.perf_counter() - started:.1f} s"
            )
    finally:
        store.close()


@contextlib.contextmanager
def _store_file(kept: str | None, pg_url: str | None) -> Iterator[str]:
    """The store's target: ``kept`` (a SQLite file), a fresh schema of the PostgreSQL server
    ``pg_url`` (dropped afterwards), or a SQLite file in a temporary directory."""
    if pg_url:
        with postgres_schema(pg_url) as (target, _size):
            yield target
    elif kept:
        yield kept
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield str(Path(tmp) / "audit.db")


async def run(
    report: Report, path: str, history: int, rounds: int, warmup: int, backend: str
) -> None:
    server = SandboxServer(
        ServerConfig(listen="127.0.0.1:0", pool_size=2, audit_db=path, docker=backend == "docker")
    )
    address = await server.start()
    manager = server.runner.sessions
    store: Any = server.runner.store
    dead = open_store(path, instance="bench-dead")  # a server that takes a session, then dies
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
        assert tenant == TENANT, tenant
        cases = {f"{size} cells": (size, HANDED) for size in sizes}
        cases["10 cells, dead holder"] = (10, DEAD)
        cpu: dict[str, list[float]] = {label: [] for label in cases}
        sandbox_cpu: dict[str, list[float]] = {label: [] for label in cases}
        # (asked → taken over, taken over → first cell, asked → first cell) per rebuild
        clock: dict[str, list[tuple[float, float, float]]] = {label: [] for label in cases}

        async def let_go(session_id: str, how: str) -> None:
            held = manager._sessions.pop(session_id)
            await held.sandbox.dispose()
            assert await asyncio.to_thread(store.hand_over, session_id, "bench")
            if how == DEAD:
                # Another server took the session over, then died: its lease ran out a second
                # ago, and the rebuild finds the record running under a holder that is gone.
                taken = await asyncio.to_thread(dead.take_over, tenant, session_id)
                assert taken == store.instance, taken
                await asyncio.to_thread(dead.heartbeat, "127.0.0.1:1", -1.0)

        def case(label: str) -> Any:
            size, how = cases[label]

            async def rebuild() -> float:
                await let_go(ids[size], how)
                await pool.wait_ready()
                cpu_before, started = time.process_time(), time.perf_counter()
                session = await manager.resume(tenant, ids[size], BOUNDS)
                elapsed = time.perf_counter() - started
                cpu[label].append(time.process_time() - cpu_before)
                sandbox_cpu[label].append(session.sandbox.handle.usage().cpu_time_s)
                assert len(session.executions) == size
                points, first = session.rebuilt, session.sandbox.first_job_at
                assert points is not None and first is not None
                clock[label].append(
                    (
                        points.taken_over - points.asked,
                        first - points.taken_over,
                        first - points.asked,
                    )
                )
                return elapsed

            return rebuild

        report.section(
            f"{history:,} executions in the store: rebuild a session (take-over, replay, verify) "
            f"on {backend}"
        )
        times = await interleave({label: case(label) for label in cases}, rounds, warmup=warmup)
        for label, (size, _how) in cases.items():
            _report_case(report, label, size, times[label], cpu[label], sandbox_cpu[label], clock)
    finally:
        dead.close()
        await server.stop(grace_s=1.0)


def _report_case(
    report: Report,
    label: str,
    size: int,
    values: list[float],
    cpu: list[float],
    sandbox_cpu: list[float],
    clock: dict[str, list[tuple[float, float, float]]],
) -> None:
    report.timings(f"{label}: wall time", values)
    cpu_s, box_s = cpu[-len(values) :], sandbox_cpu[-len(values) :]
    report.figure(f"{label}: server CPU p50", percentile(cpu_s, 0.5) * 1000, "ms")
    report.figure(f"{label}: sandbox CPU p50", percentile(box_s, 0.5) * 1000, "ms")
    report.figure(f"{label}: wall time per cell", percentile(values, 0.5) / size * 1000, "ms")
    points = clock[label][-len(values) :]
    report.timings(f"{label}: asked -> taken over", [p[0] for p in points])
    first = [p[1] for p in points]
    over = percentile(first, 1.0) * 1000 > TARGET_MS
    report.timings(
        f"{label}: taken over -> first cell sent",
        first,
        note=f"  max {max(first) * 1000:.2f} ms, target {TARGET_MS:g} ms"
        + (": OVER" if over else ""),
    )
    report.timings(f"{label}: asked -> first cell sent", [p[2] for p in points])


async def main(report: Report, args: Any) -> None:
    rounds, warmup, backend = args.rounds, args.warmup, args.backend
    histories = sorted(int(s.replace("_", "")) for s in args.history.split(","))
    with _store_file(args.store, args.pg_url) as path:
        for history in histories:
            prefill(path, history, report)
            await run(report, path, history, rounds, warmup, backend)


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=5)
    parser.add_argument("--backend", choices=["process", "docker"], default="process")
    parser.add_argument(
        "--history", default="0", help="executions of the tenant in the store (comma list)"
    )
    parser.add_argument("--store", default=None, help="a SQLite file kept between runs")
    parser.add_argument("--pg-url", default=None, help="PostgreSQL server (a fresh schema)")
    args = parser.parse_args()
    with Report("session_rebuild", args) as report:
        asyncio.run(main(report, args))
