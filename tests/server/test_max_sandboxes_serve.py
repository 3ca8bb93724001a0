"""A real `ptc serve` at its `max_sandboxes` cap (server.toml; a memory budget lowers it the same
way): a burst larger than the cap all runs, starts on demand take idle warm sandboxes' rooms,
the cap is visible in the metrics, and a stop with an execution waiting for a room ends it at
once (`interrupted`, no sandbox ever its own) and exits cleanly.

Stop 30's CI hung here: a served execution waited for a room that two idle warm sandboxes held
for ever, and the server's stop waited for that execution. The engine-level cases are in
`tests/backends/test_max_sandboxes.py`."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.client import AsyncClient, Client
from sandbox.result import ExecutionResult
from tests.ptc_serve import Serving, ptc_serve, start_serve, stop_serve

pytestmark = pytest.mark.requires_bwrap


def _rooms(serving: Serving) -> dict[str, float]:
    """ptc_sandbox_rooms by state, the evictions, and the idle and busy sandboxes, as the
    server's /metrics shows them."""
    assert serving.metrics_address is not None
    with urllib.request.urlopen(f"http://{serving.metrics_address}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    rooms: dict[str, float] = {}
    for line in lines:
        if line.startswith('ptc_sandbox_rooms{backend="process",state="'):
            state = line.split('state="', 1)[1].split('"', 1)[0]
            rooms[state] = float(line.rsplit(" ", 1)[1])
        elif line.startswith('ptc_sandbox_rooms_evicted_total{backend="process"}'):
            rooms["evicted"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith('ptc_sandboxes{backend="process",state="'):
            state = line.split('state="', 1)[1].split('"', 1)[0]
            rooms[state] = float(line.rsplit(" ", 1)[1])
    return rooms


def _wait_for(serving: Serving, **wanted: float) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rooms = _rooms(serving)
        if all(rooms.get(key) == value for key, value in wanted.items()):
            return
        time.sleep(0.05)
    raise AssertionError(f"the server never showed {wanted}: {_rooms(serving)}")


@pytest.fixture
def config(tmp_path: Path) -> Iterator[str]:
    toml = tmp_path / "server.toml"
    toml.write_text("max_sandboxes = 1\npool_size = 1\nshutdown_grace_s = 1\n")
    yield str(toml)


def test_a_burst_beyond_the_cap_all_runs(config: str) -> None:
    with ptc_serve(
        "--config", config, "--audit-db", "memory", "--metrics-listen", "127.0.0.1:0"
    ) as serving:
        _wait_for(serving, idle=1, held=1, limit=1)
        with Client(serving.address) as client:
            # Another private tmp size than the warm sandbox's: started on demand, in its room.
            alone = client.execute("print('own tmp')", limits={"file_size": 2 * 1024**2})
        assert (alone.status, alone.stdout) == ("ok", "own tmp\n"), alone.to_json()
        assert _rooms(serving)["evicted"] == 1
        _wait_for(serving, idle=1, held=1, busy=0)  # the pool is warm again, in the room

        async def burst() -> list[ExecutionResult]:
            async with AsyncClient(serving.address) as client:
                # Every other one with its own private tmp size: started on demand.
                return await asyncio.gather(
                    *(
                        client.execute(
                            f"print({i})", limits={"file_size": 2 * 1024**2} if i % 2 else None
                        )
                        for i in range(6)
                    )
                )

        results = asyncio.run(asyncio.wait_for(burst(), 120))
        assert [(r.status, r.stdout) for r in results] == [("ok", f"{i}\n") for i in range(6)]
        _wait_for(serving, waiting=0, busy=0)
        with Client(serving.address) as client:
            assert client.execute("print('healthy')").stdout == "healthy\n"


def test_a_stop_ends_an_execution_waiting_for_a_room(config: str) -> None:
    proc, serving = start_serve(
        "--config", config, "--audit-db", "memory", "--metrics-listen", "127.0.0.1:0"
    )
    try:

        async def scenario() -> tuple[ExecutionResult, ExecutionResult]:
            async with AsyncClient(serving.address) as client:
                holder = asyncio.ensure_future(
                    client.execute("import time\ntime.sleep(60)", limits={"wall_time_ms": 90_000})
                )
                await asyncio.to_thread(_wait_for, serving, busy=1, held=1)
                waiter = asyncio.ensure_future(client.execute("print('never')"))
                await asyncio.to_thread(_wait_for, serving, waiting=1)
                assert not holder.done()
                proc.terminate()
                return await holder, await waiter

        held, waited = asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        stderr = stop_serve(proc)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert held.status == "interrupted", (held.violations, held.effective_limits)
    assert (waited.status, waited.stdout, list(waited.isolation)) == ("interrupted", "", [])
    assert "draining: 2 executions in flight get 1.0 s to finish" in stderr
