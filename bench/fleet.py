"""A fleet on one machine: `print(1)` executions/s through 1 vs 3 `ptc serve` sharing PostgreSQL,
and what the global quota bookkeeping costs per execution.

Run: ``.venv/bin/python -m bench.fleet [--rounds 5] [--postgres URL]`` (default URL:
``$PTC_TEST_POSTGRES_URL``; without one it says so and exits 0). In a fresh schema it starts four
real servers with the same tenants file and audit database: three with global quotas (the default
with PostgreSQL) and one with ``global_quotas = false``. Interleaved blocks then send
``--runs`` executions of ``print(1)`` at ``--concurrency`` to

- ``1 server, global quotas``: the first server alone,
- ``3 servers, global quotas``: the three, round robin (what a load balancer does),
- ``1 server, local quotas``: the fourth server (same audit store, quotas in memory),

each block's sample being its executions/s. Section 2 times the bookkeeping itself, in process:
one admission and release by `GlobalQuotas` (a transaction and a DELETE) against the in-memory
`TenantRegistry` gate, interleaved. On a machine with few cores the three servers share the same
cores as the one, so the 3-vs-1 ratio measures the fleet's coordination cost, not its capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from bench.grpc import spawn, stop
from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.client import AsyncClient
from sandbox.tenants import hash_key, load_tenancy
from sandbox.tenants.global_quota import GlobalQuotas

KEY = "ptc-bench-key-fleet-0123456789"
TENANTS = f"""
[[tenant]]
id = "bench"
keys = ["{hash_key(KEY)}"]
max_concurrent = 64
queue = 1024
rate_per_minute = 6000000
backends = ["process"]
"""


@contextlib.contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    import psycopg

    schema = f"ptc_bench_fleet_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def burst(clients: list[AsyncClient], runs: int, concurrency: int) -> float:
    """``runs`` executions of print(1) spread round robin over ``clients``; executions/s."""
    slots = asyncio.Semaphore(concurrency)
    turn = itertools.cycle(clients)
    loop = asyncio.get_running_loop()

    async def one(client: AsyncClient) -> None:
        async with slots:
            result = await client.execute("print(1)")
            if result.status != "ok" or result.stdout != "1\n":
                raise SystemExit(f"bench.fleet: {result.status} {result.stderr[-300:]!r}")

    started = loop.time()
    await asyncio.gather(*(one(next(turn)) for _ in range(runs)))
    return runs / (loop.time() - started)


async def served(report: Report, url: str, args: object, tmp: Path) -> None:
    tenants = tmp / "tenants.toml"
    tenants.write_text(TENANTS)
    local = tmp / "local.toml"
    local.write_text("global_quotas = false\n")
    common = ["-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--pool-size", "2",
              "--audit-db", url, "--tenants", str(tenants)]  # fmt: skip
    procs = []
    try:
        addresses = []
        for name in ("g1", "g2", "g3"):
            proc, address = spawn([*common, "--instance-id", f"bench-{name}"])
            procs.append(proc)
            addresses.append(address)
        proc, local_address = spawn(
            [*common, "--instance-id", "bench-local", "--config", str(local)]
        )
        procs.append(proc)
        clients = [AsyncClient(a, api_key=KEY) for a in [*addresses, local_address]]
        try:
            runs, concurrency = args.runs, args.concurrency  # type: ignore[attr-defined]
            cases = {
                "1 server, global quotas": lambda: burst(clients[:1], runs, concurrency),
                "3 servers, global quotas": lambda: burst(clients[:3], runs, concurrency),
                "1 server, local quotas": lambda: burst(clients[3:], runs, concurrency),
            }
            rates = await interleave(cases, args.rounds, warmup=args.warmup)  # type: ignore[attr-defined]
        finally:
            for client in clients:
                await client.close()
    finally:
        for proc in procs:
            stop(proc)
    report.section(
        f"1. print(1) through real servers on one PostgreSQL ({args.runs} runs per block at "  # type: ignore[attr-defined]
        f"concurrency {args.concurrency}, {os.cpu_count()} CPUs)"  # type: ignore[attr-defined]
    )
    for label, values in rates.items():
        report.figure(
            label,
            percentile(values, 0.5),
            "executions/s",
            note=f"median of {len(values)}; min {min(values):.1f}, max {max(values):.1f}",
        )
    one = percentile(rates["1 server, global quotas"], 0.5)
    report.figure(
        "3 servers / 1 server", percentile(rates["3 servers, global quotas"], 0.5) / one, "x"
    )
    per_exec_global = 1 / one
    per_exec_local = 1 / percentile(rates["1 server, local quotas"], 0.5)
    report.figure(
        "global - local quotas, per execution",
        (per_exec_global - per_exec_local) * 1000,
        "ms",
        note="wall time per execution at this concurrency; noisy, see section 2",
    )
    report.data("rates", rates)


async def bookkeeping(report: Report, url: str, rounds: int) -> None:
    tenants = Path(tempfile.mkdtemp(prefix="ptc-bench-fleet-")) / "tenants.toml"
    tenants.write_text(TENANTS)
    registry = load_tenancy(tenants)
    tenant = registry.tenant("bench")
    assert tenant is not None
    quotas = GlobalQuotas(registry, url, burst=lambda t: 6000000, instance="bench-inproc")
    await quotas.start()
    try:

        async def global_admit() -> None:
            async with quotas.admit(tenant):
                pass
            await asyncio.gather(*quotas._cleanup)  # the release is part of the cost

        async def local_admit() -> None:
            async with registry.admit(tenant):
                pass

        times = await interleave(
            {"GlobalQuotas (PostgreSQL)": global_admit, "TenantRegistry (memory)": local_admit},
            rounds,
            warmup=20,
        )
    finally:
        await quotas.close()
        tenants.unlink()
        tenants.parent.rmdir()
    report.section("2. quota bookkeeping per execution: admit + release, in process")
    for label, values in times.items():
        report.timings(label, values)
    report.figure(
        "global bookkeeping, mean",
        statistics.fmean(times["GlobalQuotas (PostgreSQL)"]) * 1000,
        "ms",
        note="one transaction (lock the tenant row, count, insert the lease), one DELETE",
    )


async def main(report: Report, args: object) -> None:
    url = args.postgres or os.environ.get("PTC_TEST_POSTGRES_URL")  # type: ignore[attr-defined]
    if not url:
        report.print("bench.fleet: skipped (no --postgres URL and PTC_TEST_POSTGRES_URL unset)")
        return
    with fresh_schema(url) as schema, tempfile.TemporaryDirectory(prefix="ptc-bench-") as tmp:
        await served(report, schema, args, Path(tmp))
        await bookkeeping(report, schema, args.rounds * 40)  # type: ignore[attr-defined]


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=5)
    parser.add_argument("--postgres", default=None, help="PostgreSQL URL")
    parser.add_argument("--runs", type=int, default=40, help="executions per block")
    parser.add_argument("--concurrency", type=int, default=6, help="in flight at once")
    arguments = parser.parse_args()
    with Report("fleet", arguments) as report:
        asyncio.run(main(report, arguments))
