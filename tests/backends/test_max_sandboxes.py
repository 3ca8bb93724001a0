"""The process backend under a small `max_sandboxes` (as a server's memory budget sets it): warm
sandboxes hold rooms, and an execution never waits for a room that nobody will give back.

Before `sandbox.backends.capacity`, the execution that came while the pool was starting (stop
30's CI: a served execution under a memory budget of 2 sandboxes hung, and so did the server's
stop) and the start on demand beside an idle sandbox waited for ever; the cancel and close
cases had no way out of that wait either. Every execution is bounded here by
`asyncio.wait_for`, so a regression fails instead of hanging.
Each test has a backend of its own (leftover checks count every sandbox of this process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psutil
import pytest

from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, RunHooks
from sandbox.errors import Unavailable
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

BOUND_S = 60.0  # far beyond any execution here: only a wait that never ends reaches it


@pytest.fixture
def small(engine_harness: type[EngineHarness]) -> Iterator[Callable[..., EngineHarness]]:
    made: list[EngineHarness] = []

    def make(max_sandboxes: int, pool_size: int) -> EngineHarness:
        harness = engine_harness(pool_size=pool_size, max_sandboxes=max_sandboxes)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        assert harness.leftovers() == []
        assert harness.backend.capacity.waiting == 0
        harness.close()
        assert harness.backend.capacity.held == 0


async def _execute(
    harness: EngineHarness, script: str, cancel: asyncio.Event | None = None, **limits: object
) -> ExecutionResult:
    request = ExecutionRequest(
        script=script,
        manifest="[]",
        limits=parse_limit_args(f"{k}={v}" for k, v in limits.items()),
    )
    return await asyncio.wait_for(
        harness.engine.execute(request, hooks=RunHooks(cancel=cancel)), BOUND_S
    )


def test_more_executions_than_rooms_all_run(small: Callable[..., EngineHarness]) -> None:
    harness = small(max_sandboxes=2, pool_size=2)

    async def burst() -> list[ExecutionResult]:
        # Two take the warm ones; their refills find no room, and the third waits its turn.
        return await asyncio.gather(*(_execute(harness, f"print({i})") for i in range(5)))

    results = harness.call(burst())
    assert [(r.status, r.stdout) for r in results] == [("ok", f"{i}\n") for i in range(5)]
    assert harness.backend.pool.target <= 2  # a pool never keeps more warm than the rooms


def test_an_execution_that_comes_while_the_pool_is_starting_runs() -> None:
    # Stop 30's CI hang exactly: a pool of 2 still starting under `max_sandboxes` 2 when the
    # first execution came. Its miss raised the pool's target to 3, its own start waited for a
    # room, and the two pooled sandboxes, once ready, kept both rooms idle for ever.
    backend = build_backend("process", ProcessBackendConfig(pool_size=2, max_sandboxes=2))
    engine = Engine(EngineConfig(backends={"process": backend}))
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    async def scenario() -> ExecutionResult:
        await engine.start()
        try:
            request = ExecutionRequest(script="print(6 * 7)", manifest="[]")
            return await asyncio.wait_for(engine.execute(request), BOUND_S)
        finally:
            await engine.close()

    result = asyncio.run(scenario())
    assert (result.status, result.stdout) == ("ok", "42\n"), result.to_json()
    assert isinstance(backend, ProcessBackend)
    assert (backend.capacity.held, backend.capacity.waiting) == (0, 0)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after - before == set()


def test_a_start_on_demand_takes_the_room_of_an_idle_sandbox(
    small: Callable[..., EngineHarness],
) -> None:
    harness = small(max_sandboxes=1, pool_size=1)
    assert (harness.backend.pool.idle, harness.backend.capacity.held) == (1, 1)
    # Another private tmp size than the warm sandbox's: started on demand, in its room.
    result = harness.call(_execute(harness, "print('own tmp')", file_size="2m"))
    assert (result.status, result.stdout) == ("ok", "own tmp\n"), result.to_json()
    assert harness.backend.capacity.evicted == 1
    harness.assert_healthy()


def test_an_execution_waiting_for_a_room_ends_cancelled_when_its_caller_leaves(
    small: Callable[..., EngineHarness],
) -> None:
    harness = small(max_sandboxes=1, pool_size=1)
    backend = harness.backend

    async def scenario() -> tuple[ExecutionResult, int]:
        held = await backend.acquire(backend.config.pool_limits)  # the only room, running
        cancel = asyncio.Event()
        waiting = asyncio.ensure_future(_execute(harness, "print('never')", cancel))
        while backend.capacity.waiting == 0:
            await asyncio.sleep(0.01)
        cancel.set()
        result = await waiting
        waiters_after = backend.capacity.waiting
        await held.dispose()
        return result, waiters_after

    result, waiters_after = harness.call(scenario())
    assert (result.status, result.stdout, result.exit_code) == ("cancelled", "", 0)
    assert result.isolation == []  # no sandbox was ever its own
    assert waiters_after == 0  # its place in the queue went with it
    harness.assert_healthy()


def test_closing_the_backend_fails_an_execution_that_waits_for_a_room(
    engine_harness: type[EngineHarness],
) -> None:
    harness = engine_harness(pool_size=1, max_sandboxes=1)
    backend = harness.backend

    async def scenario() -> BaseException | ExecutionResult:
        held = await backend.acquire(backend.config.pool_limits)
        waiting = asyncio.ensure_future(_execute(harness, "print('never')"))
        while backend.capacity.waiting == 0:
            await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(harness.engine.close())
        outcome = (await asyncio.gather(waiting, return_exceptions=True))[0]
        await held.dispose()
        await closing
        return outcome

    try:
        outcome = harness.call(scenario())
    finally:
        harness.loop.call_soon_threadsafe(harness.loop.stop)
    assert isinstance(outcome, Unavailable), repr(outcome)
    assert outcome.message == "the backend is closing"
    assert (backend.capacity.held, backend.capacity.waiting) == (0, 0)
