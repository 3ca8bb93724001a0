"""`bench.serve_profile`: the profiling wrapper around a real ``ptc serve`` switches its profiler
with its own signals (``ptc serve`` answers SIGUSR1 itself, with its stacks), and the profile it
writes covers the served executions."""

from __future__ import annotations

import asyncio
import pstats
from pathlib import Path

import pytest

from bench.serve_profile import Server

pytestmark = pytest.mark.requires_bwrap
ROOT = Path(__file__).resolve().parents[2]


def test_a_profiled_block_profiles_the_servers_executions() -> None:
    async def run() -> tuple[dict[str, float], pstats.Stats, Path]:
        server = Server("this", ROOT, ["--pool-size", "1"])
        try:
            figures = await server.block(executions=4, concurrency=2)
            stats = pstats.Stats(await server.profiled(executions=6, concurrency=2))
            assert Path(server.stats + ".done").exists()
            return figures, stats, Path(server.dir.name)
        finally:
            await server.close()

    figures, stats, workdir = asyncio.run(run())
    # CPU figures come in clock ticks (10 ms): a 4-execution block may read 0 on either side.
    assert set(figures) == {
        "server process",
        "server main thread",
        "server other threads",
        "client (this process)",
    }
    assert figures["server process"] >= 0 and figures["client (this process)"] >= 0
    assert not workdir.exists()  # the server's directory went with it
    calls = {
        (Path(func[0]).name, func[2]): counts[1]
        for func, counts in stats.stats.items()  # type: ignore[attr-defined]
    }
    # `Runner.prepare` (plain, not a coroutine: one call each) ran for each profiled execution.
    assert calls.get(("runner.py", "prepare")) == 6


def test_the_bare_engine_server_serves_the_sdks_execute_and_is_stopped() -> None:
    async def run() -> tuple[dict[str, float], Server]:
        server = Server("bare", ROOT, [], bare=True)
        try:
            result = await server.client.execute("print(6 * 7)")
            assert (result.status, result.stdout) == ("ok", "42\n")
            return await server.block(executions=4, concurrency=2), server
        finally:
            await server.close()

    figures, server = asyncio.run(run())
    assert figures["server process"] >= 0
    assert server.proc.returncode == 0  # it stopped at SIGTERM, its engine closed


def test_a_raw_client_runs_the_same_execute_without_the_sdk() -> None:
    async def run() -> tuple[dict[str, float], Server]:
        server = Server("raw", ROOT, ["--pool-size", "1"], raw_client=True)
        try:
            return await server.block(executions=4, concurrency=2), server
        finally:
            await server.close()

    figures, server = asyncio.run(run())  # each reply was checked: status ok, stdout "1\n"
    assert figures["client (this process)"] >= 0
    assert server.proc.returncode is not None
