"""How the host learns that a sandbox ended, in both modes: a pidfd to pid 1 (the kernel keeps
its exit status; no process beside the sandbox) and a reaper process per sandbox (any kernel).

Each mode must give the same exit codes, the same kills, and must not let a sandbox outlive the
host that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
import pytest

from sandbox.backends.process import pidfd
from sandbox.backends.process.cgroups import CgroupManager
from sandbox.backends.process.runtime_dir import sweep_stale_runtime_dirs

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

PIDFD_OK = pidfd.exit_status_supported()
MODES = [
    pytest.param(
        "pidfd",
        marks=pytest.mark.skipif(not PIDFD_OK, reason="kernel without PIDFD_INFO_EXIT (< 6.15)"),
    ),
    "reaper",
]


@pytest.fixture(params=MODES)
def moded(
    request: pytest.FixtureRequest, engine_harness: type[EngineHarness]
) -> Iterator[EngineHarness]:
    harness = engine_harness(exit_status=request.param)
    yield harness
    assert harness.leftovers() == []
    harness.close()


@pytest.mark.parametrize(
    ("script", "status", "exit_code"),
    [
        ("print('fine')", "ok", 0),
        ("import os\nos._exit(7)", "error", 7),
        ("import ctypes\nctypes.string_at(0)", "error", -11),
    ],
    ids=["ok", "os-exit", "segv"],
)
def test_exit_codes_are_the_kernels(
    moded: EngineHarness, script: str, status: str, exit_code: int
) -> None:
    result = moded.run(script)
    assert (result.status, result.exit_code) == (status, exit_code), result.to_json()


def test_a_killed_sandbox_reports_the_kill(moded: EngineHarness) -> None:
    result = moded.run("import time\ntime.sleep(30)", limits={"wall_time": 0.5})
    assert (result.status, result.exit_code) == ("limit_exceeded", -signal.SIGKILL), (
        result.to_json()
    )
    assert [v.limit for v in result.violations] == ["wall_time"]
    moded.assert_healthy()


def test_processes_per_idle_sandbox(moded: EngineHarness) -> None:
    moded.settle()
    handle = moded.backend.pool._idle[0]
    assert handle.cgroup is not None
    members = handle.cgroup.pids()
    mode = moded.backend.zygote.settings.exit_status  # type: ignore[union-attr]
    if mode == "pidfd":
        # Only pid 1 itself, and the host holds a pidfd to it.
        assert members == [handle.pid]
        assert pidfd.is_namespace_init(handle.pid)
    else:
        # pid 1 and its reaper, which is the handle's pid.
        assert len(members) == 2 and handle.pid in members
        assert not pidfd.is_namespace_init(handle.pid)


HOST = """
import asyncio, os, signal, sys
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import Limits
async def main():
    backend = ProcessBackend(ProcessBackendConfig(pool_size=2, exit_status=sys.argv[1]))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    await backend.pool.wait_ready()
    # One sandbox busy with a script that never reads its channel again, and idle ones.
    asyncio.create_task(engine.execute(ExecutionRequest(
        "import time\\ntime.sleep(600)", limits=Limits(wall_time_ms=600_000))))
    await asyncio.sleep(1.5)
    await backend.pool.wait_ready()
    pids = set(backend.zygote.pids())
    for parent in backend.cgroups.parent_paths:
        for cgroup in parent.iterdir():
            if cgroup.is_dir():
                pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
    print(" ".join(map(str, sorted(pids))), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
asyncio.run(main())
"""


@pytest.mark.parametrize("mode", MODES)
def test_sandboxes_die_with_their_host(mode: str) -> None:
    """A host killed with SIGKILL cannot clean up: its sandboxes, zygote and bwrap must go by
    themselves (the zygote sees its control socket end, a reaper its status pipe)."""
    host = subprocess.run(
        [sys.executable, "-c", HOST, mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        check=False,
    )
    assert host.returncode == -signal.SIGKILL, host.stderr
    pids = [int(p) for p in host.stdout.split()]
    # bwrap, the zygote, the busy sandbox and at least two idle ones (reapers too in that mode)
    assert len(pids) >= 5, host.stdout
    try:
        # They go at once (milliseconds); 2 s is the margin for a loaded machine, and shorter
        # than what this machine's own process supervisor takes to kill orphans (about 4 s).
        deadline = time.monotonic() + 2
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p) and _not_zombie(p)]
            time.sleep(0.05)
        assert alive == [], f"outlived their host by 2 s: {[_describe(p) for p in alive]}"
    finally:
        # What a dead host leaves for the next start to sweep: its cgroups and runtime dir.
        manager = CgroupManager.detect()
        if manager is not None:
            manager.cleanup_stale()
            manager.close()
        sweep_stale_runtime_dirs()


def _describe(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        return f"{pid} (parent {proc.ppid()}, {proc.status()}: {' '.join(proc.cmdline())[:80]})"
    except psutil.NoSuchProcess:
        return f"{pid} (gone)"


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
