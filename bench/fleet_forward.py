"""What carrying a session call costs: a cell through the server holding the session vs through
another server of the fleet, which forwards it (`sandbox.server.forwarding`).

Run: ``.venv/bin/python -m bench.fleet_forward [--rounds 10] [--cells 20] [--postgres URL]``
(default URL: ``$PTC_TEST_POSTGRES_URL``; without one it says so and exits 0). In a fresh schema it
starts two real ``ptc serve`` processes sharing the store, A and B, and opens one session on A.
Interleaved blocks (rotating order, one discarded warm-up block) then send ``--cells`` unary
cells ``n += 1`` to that session

- ``through the holder``: to A itself,
- ``through another server``: to B, which looks the holder up in the store and carries the call,

Per cell it prints the wall time p50/p95 and the CPU time of both servers together (user +
system, including the sandbox's, read from /proc around each block), and the ratios. Both servers
run on the same cores as this client, so the CPU figure is the whole fleet's cost of one cell.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from bench.fleet import KEY as FLEET_KEY
from bench.fleet import TENANTS, fresh_schema
from bench.grpc import cpu_seconds, spawn, stop
from bench.harness import Report, bench_parser, percentile
from sandbox.client import AsyncClient

CASES = ("through the holder", "through another server")


async def _block(
    client: AsyncClient, session_id: str, cells: int, pids: list[int]
) -> tuple[list[float], float]:
    """``cells`` cells through ``client``: each one's wall time, and the servers' CPU per cell."""
    session = client.session(session_id=session_id)
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    walls = []
    for _ in range(cells):
        started = time.perf_counter()
        result = await session.execute("n += 1")
        walls.append(time.perf_counter() - started)
        if result.status != "ok":
            raise SystemExit(f"bench.fleet_forward: {result.status} {result.stderr[-300:]!r}")
    return walls, (sum(cpu_seconds(pid) for pid in pids) - cpu_before) / cells


async def measure(url: str, args: object, tmp: Path) -> dict[str, tuple[list[float], list[float]]]:
    tenants = tmp / "tenants.toml"
    tenants.write_text(TENANTS)
    common = ["-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--pool-size", "1",
              "--audit-db", url, "--tenants", str(tenants)]  # fmt: skip
    proc_a, address_a = spawn([*common, "--instance-id", "bench-fwd-a"])
    procs = [proc_a]
    proc_b, address_b = spawn([*common, "--instance-id", "bench-fwd-b"])
    procs.append(proc_b)
    pids = [p.pid for p in procs]
    holder, other = AsyncClient(address_a, FLEET_KEY), AsyncClient(address_b, FLEET_KEY)
    out: dict[str, tuple[list[float], list[float]]] = {case: ([], []) for case in CASES}
    try:
        await _wait_members(url, 2)
        session = holder.session()
        session_id = (await session.create()).session_id
        await session.execute("n = 0")
        clients = dict(zip(CASES, (holder, other), strict=True))
        rounds, cells = args.rounds, args.cells  # type: ignore[attr-defined]
        for index in range(1 + rounds):
            for case in CASES if index % 2 == 0 else CASES[::-1]:
                walls, cpu = await _block(clients[case], session_id, cells, pids)
                if index > 0:  # the first block of each warms channels and caches
                    out[case][0].extend(walls)
                    out[case][1].append(cpu)
        await session.close()
    finally:
        await holder.close()
        await other.close()
        for proc in procs:
            stop(proc)
    return out


async def _wait_members(url: str, count: int) -> None:
    import psycopg

    for _ in range(600):
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT COUNT(*) FROM fleet_members").fetchone()
        if row is not None and row[0] == count:
            return
        await asyncio.sleep(0.05)
    raise SystemExit("bench.fleet_forward: the servers did not join the fleet")


def report_figures(report: Report, out: dict[str, tuple[list[float], list[float]]]) -> None:
    report.section(f"a session cell (n += 1), unary, two servers on one PostgreSQL, "
                   f"{os.cpu_count()} CPUs")  # fmt: skip
    for case in CASES:
        walls, cpus = out[case]
        report.timings(f"{case}: wall per cell", walls)
        report.figure(f"{case}: CPU per cell", percentile(cpus, 0.5) * 1000, "ms",
                      note=f"both servers, median of {len(cpus)} blocks")  # fmt: skip
    holder_w, other_w = (percentile(out[c][0], 0.5) for c in CASES)
    holder_c, other_c = (percentile(out[c][1], 0.5) for c in CASES)
    report.figure("wall p50: another server / the holder", other_w / holder_w, "x")
    report.figure("wall p50 added by forwarding", (other_w - holder_w) * 1000, "ms")
    report.figure("CPU per cell: another server / the holder", other_c / holder_c, "x")
    report.figure("CPU per cell added by forwarding", (other_c - holder_c) * 1000, "ms")
    report.data("samples", {c: {"wall_s": out[c][0], "cpu_s": out[c][1]} for c in CASES})


async def main(report: Report, args: object) -> None:
    url = args.postgres or os.environ.get("PTC_TEST_POSTGRES_URL")  # type: ignore[attr-defined]
    if not url:
        report.print(
            "bench.fleet_forward: skipped (no --postgres URL; PTC_TEST_POSTGRES_URL unset)"
        )
        return
    with fresh_schema(url) as schema, tempfile.TemporaryDirectory(prefix="ptc-bench-") as tmp:
        report_figures(report, await measure(schema, args, Path(tmp)))


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10)
    parser.add_argument("--postgres", default=None, help="PostgreSQL URL")
    parser.add_argument("--cells", type=int, default=20, help="cells per block")
    arguments = parser.parse_args()
    with Report("fleet_forward", arguments) as report:
        asyncio.run(main(report, arguments))
