"""`bench.floor.sandbox_cgroups_cpu_s`: the sandboxes' CPU by their parent cgroup, which the
benchmarks set beside the floor's. Real forks and cgroups, as root like the process backend."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.floor import sandbox_cgroups_cpu_s
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest

pytestmark = pytest.mark.requires_bwrap

BURN = "import time\nend = time.process_time() + 0.1\nwhile time.process_time() < end: pass\n"


def test_the_parent_cgroups_count_every_sandbox_through_its_exit() -> None:
    async def run() -> tuple[float, float, float]:
        backend = ProcessBackend(ProcessBackendConfig(pool_size=1))
        engine = Engine(EngineConfig(backends={"process": backend}))
        await engine.start()
        try:
            await backend.pool.wait_ready()
            before = sandbox_cgroups_cpu_s(os.getpid())
            results = [await engine.execute(ExecutionRequest(BURN)) for _ in range(3)]
            assert all(r.status == "ok" for r in results), [r.to_json() for r in results]
            await backend.drain()  # every used sandbox has exited and its cgroup is gone
            await backend.pool.wait_ready()  # and the next one waits, idle, for a job
            # The warm sandbox said it is ready from inside a write; on a loaded machine the rest
            # of that system call and its way into the blocking read that follows may run after
            # the host heard it (tens of microseconds). Let it get there before the first reading.
            await asyncio.sleep(0.05)
            after = sandbox_cgroups_cpu_s(os.getpid())
            reported = sum(r.usage.cpu_time_s for r in results)
            await asyncio.sleep(0.2)
            still = sandbox_cgroups_cpu_s(os.getpid())  # nothing runs: the reading stands still
            return after - before, reported, still - after
        finally:
            await engine.close()

    counted, reported, idle = asyncio.run(run())
    # Each script burned 0.1 s of CPU in its own cgroup, which is gone by now: its parent kept it.
    assert counted >= 0.3
    # Each result read its cgroup before pid 1's exit and includes its idle set-up from before
    # `before` (a few ms): the parent's figure covers the rest of each sandbox's life.
    assert counted >= reported - 0.05
    assert idle == 0.0


def test_a_process_without_sandboxes_is_refused_by_name() -> None:
    # Pid 1 (the init of this machine or container) runs no process backend of ours.
    with pytest.raises(RuntimeError, match="process 1 has no sandbox cgroups under /"):
        sandbox_cgroups_cpu_s(1)
