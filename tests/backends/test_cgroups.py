"""Real cgroups, real processes: limits bind, usage is accounted, nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.process.cgroups import (
    CgroupLimits,
    CgroupManager,
    SandboxCgroup,
)

PREFIX = "ptctest"
PYTHON = "/usr/bin/python3.11" if Path("/usr/bin/python3.11").exists() else sys.executable
MiB = 1 << 20


def _unavailable() -> str | None:
    manager = CgroupManager.detect(prefix=PREFIX)
    if manager is None:
        return CgroupManager.unavailable_reason() or "unknown reason"
    manager.close()
    return None


_REASON = _unavailable()
pytestmark = pytest.mark.skipif(
    _REASON is not None, reason=f"cannot create and write cgroups: {_REASON}"
)


@pytest.fixture(scope="module")
def manager() -> Iterator[CgroupManager]:
    found = CgroupManager.detect(prefix=PREFIX)
    assert found is not None, CgroupManager.unavailable_reason()
    yield found
    found.close()
    assert not [p for p in found.parent_paths if p.exists()]


@pytest.fixture(autouse=True)
def _nothing_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "manager" in request.fixturenames:
        mgr: CgroupManager = request.getfixturevalue("manager")
        leftovers = [c for p in mgr.parent_paths for c in p.iterdir() if c.is_dir()]
        assert leftovers == []


@pytest.fixture
def cgroup(manager: CgroupManager, request: pytest.FixtureRequest) -> Iterator[SandboxCgroup]:
    cg = manager.create(request.node.name.replace("[", "_").replace("]", "")[:60])
    yield cg
    cg.remove()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Children of the test, killed and reaped whatever happens (the cgroup is removed first)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _gated(
    cg: SandboxCgroup, argv: list[str], procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Start ``argv`` blocked on a line of stdin, move it into ``cg``, then let it go.

    Only the started process itself is moved, so it must not fork before it has read the line.
    """
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    procs.append(proc)
    cg.add_pids([proc.pid])
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    return proc


def _py(code: str) -> list[str]:
    return [PYTHON, "-I", "-S", "-c", "import sys; sys.stdin.readline()\n" + code]


def _read_file(cg: SandboxCgroup, name: str) -> str:
    return next(p / name for p in cg.paths if (p / name).exists()).read_text().strip()


def test_create_limits_remove_leaves_nothing(manager: CgroupManager) -> None:
    cg = manager.create("plain")
    assert all(p.is_dir() for p in cg.paths)
    cg.set_limits(CgroupLimits(memory_bytes=64 * MiB, pids=16, cpu_cores=0.5))
    cg.set_limits(CgroupLimits(memory_bytes=256 * MiB, pids=32, cpu_cores=None))  # raise
    cg.set_limits(CgroupLimits(memory_bytes=32 * MiB, pids=8, cpu_cores=2.0))  # lower
    if manager.version == 1:
        assert _read_file(cg, "memory.limit_in_bytes") == str(32 * MiB)
        if any((p / "memory.memsw.limit_in_bytes").exists() for p in cg.paths):
            assert _read_file(cg, "memory.memsw.limit_in_bytes") == str(32 * MiB)
        assert _read_file(cg, "cpu.cfs_quota_us") == "200000"
    else:
        assert _read_file(cg, "memory.max") == str(32 * MiB)
        assert _read_file(cg, "cpu.max") == "200000 100000"
    assert _read_file(cg, "pids.max") == "8"
    usage = cg.usage()
    assert (usage.cpu_time_ns, usage.oom_killed, usage.pids_limit_hit) == (0, False, False)
    assert cg.pids() == []
    cg.remove()
    assert not [p for p in cg.paths if p.exists()]
    cg.remove()  # idempotent


def test_a_new_cgroup_holds_the_defaults_its_first_limits_assume(manager: CgroupManager) -> None:
    """A new v1 cgroup's first `set_limits` neither reads its memory limit nor writes its CFS
    period (`V1Controls`, ``new``): both must be the kernel's defaults for every new cgroup."""
    cg = manager.create("fresh")
    try:
        if manager.version == 1:
            assert int(_read_file(cg, "memory.limit_in_bytes")) >= 1 << 62  # unlimited
            assert _read_file(cg, "cpu.cfs_period_us") == "100000"
        cg.set_limits(CgroupLimits(memory_bytes=48 * MiB, pids=12, cpu_cores=1.5))
        if manager.version == 1:
            assert _read_file(cg, "memory.limit_in_bytes") == str(48 * MiB)
            if any((p / "memory.memsw.limit_in_bytes").exists() for p in cg.paths):
                assert _read_file(cg, "memory.memsw.limit_in_bytes") == str(48 * MiB)
            assert _read_file(cg, "cpu.cfs_period_us") == "100000"
            assert _read_file(cg, "cpu.cfs_quota_us") == "150000"
        else:
            assert _read_file(cg, "memory.max") == str(48 * MiB)
            assert _read_file(cg, "cpu.max") == "150000 100000"
        assert _read_file(cg, "pids.max") == "12"
    finally:
        cg.remove()


def test_create_refuses_a_name_in_use_and_bad_names(manager: CgroupManager) -> None:
    cg = manager.create("twice")
    try:
        with pytest.raises(OSError, match="twice"):
            manager.create("twice")
        for bad in ("", "..", "a/b", ".hidden"):
            with pytest.raises(ValueError, match="bad cgroup name"):
                manager.create(bad)
    finally:
        cg.remove()


def test_cpu_time_of_a_child_is_accounted(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=256 * MiB, pids=16, cpu_cores=None))
    proc = _gated(
        cgroup,
        _py("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.25: pass"),
        procs,
    )
    assert proc.wait(timeout=10) == 0
    assert cgroup.usage().cpu_time_ns > 100_000_000


def test_cpu_cap_slows_a_busy_loop(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=256 * MiB, pids=16, cpu_cores=0.2))
    proc = _gated(
        cgroup,
        _py("import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.6: pass"),
        procs,
    )
    assert proc.wait(timeout=10) == 0
    # 0.2 cores for 0.6 s is ~0.12 s of CPU; uncapped it would be ~0.6 s.
    assert cgroup.usage().cpu_time_ns < 300_000_000


def test_memory_bomb_is_oom_killed(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=64 * MiB, pids=16, cpu_cores=None))
    bomb = "chunks = []\nfor _ in range(64):\n    chunks.append(b'x' * (8 << 20))"
    proc = _gated(cgroup, _py(bomb), procs)
    assert proc.wait(timeout=30) == -9
    usage = cgroup.usage()
    assert usage.oom_killed
    assert 0 < usage.memory_peak_bytes <= 64 * MiB


def test_memory_just_under_the_limit_is_not_killed(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=64 * MiB, pids=16, cpu_cores=None))
    proc = _gated(cgroup, _py("chunk = b'x' * (24 << 20)"), procs)
    assert proc.wait(timeout=30) == 0
    assert not cgroup.usage().oom_killed


def test_fork_bomb_hits_pids_limit(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=512 * MiB, pids=16, cpu_cores=None))
    bomb = (
        "import os, time\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(max(0.0, end - time.monotonic()) + 0.2)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.005)\n"
        "while True:\n"
        "    try:\n"
        "        os.wait()\n"
        "    except ChildProcessError:\n"
        "        break\n"
    )
    proc = _gated(cgroup, _py(bomb), procs)
    most = 0
    while proc.poll() is None:
        most = max(most, len(cgroup.pids()))
        time.sleep(0.02)
    assert proc.returncode == 0
    assert cgroup.usage().pids_limit_hit
    assert 1 < most <= 16
    peak = [p / "pids.peak" for p in cgroup.paths if (p / "pids.peak").exists()]
    if peak:
        assert int(peak[0].read_text()) <= 16


def test_kill_all_stops_a_process_that_keeps_forking(
    cgroup: SandboxCgroup, procs: list[subprocess.Popen[bytes]]
) -> None:
    cgroup.set_limits(CgroupLimits(memory_bytes=512 * MiB, pids=200, cpu_cores=None))
    proc = _gated(
        cgroup,
        ["sh", "-c", "read x; exec timeout -s KILL 20 sh -c 'while :; do sleep 10 & done'"],
        procs,
    )
    deadline = time.monotonic() + 5
    while len(cgroup.pids()) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(cgroup.pids()) >= 20
    cgroup.kill_all()
    assert cgroup.pids() == []
    assert proc.wait(timeout=5) == -9


def test_remove_kills_what_is_still_running(
    manager: CgroupManager, procs: list[subprocess.Popen[bytes]]
) -> None:
    cg = manager.create("busy")
    cg.set_limits(CgroupLimits(memory_bytes=64 * MiB, pids=8, cpu_cores=None))
    proc = _gated(cg, ["sh", "-c", "read x; sleep 30"], procs)
    cg.remove()
    assert proc.wait(timeout=5) == -9
    assert not [p for p in cg.paths if p.exists()]


def test_try_remove_removes_an_empty_cgroup_and_leaves_a_busy_one_for_remove(
    manager: CgroupManager, procs: list[subprocess.Popen[bytes]]
) -> None:
    # The event loop tries this at pid 1's exit and hands a refusal to the releasing thread,
    # whose `remove` kills and retries: a refused try must leave the cgroup whole and working.
    busy = manager.create("tried-busy")
    try:
        proc = _gated(busy, ["sh", "-c", "read x; sleep 30"], procs)
        assert busy.try_remove() is False
        assert all(p.is_dir() for p in busy.paths)
        assert proc.pid in busy.pids()  # with its `sleep`, once it has read its line
    finally:
        busy.remove()
    assert proc.wait(timeout=5) == -9
    assert not [p for p in busy.paths if p.exists()]
    assert busy.try_remove() is True  # already removed: nothing left to do

    empty = manager.create("tried-empty")
    assert empty.try_remove() is True
    assert not [p for p in empty.paths if p.exists()]
    empty.remove()  # a second removal finds nothing to do, and does not raise


def test_cleanup_stale_removes_a_dead_servers_tree(manager: CgroupManager) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = [p.parent / f"{PREFIX}-{dead.pid}-1" for p in manager.parent_paths]
    orphan = subprocess.Popen(["sleep", "30"])
    try:
        for parent in stale:
            (parent / "left-over").mkdir(parents=True)
            (parent / "left-over" / "cgroup.procs").write_text(str(orphan.pid))
        live = list(manager.parent_paths)
        assert manager.cleanup_stale() == 1
        assert orphan.wait(timeout=5) == -9
        assert not [p for p in stale if p.exists()]
        assert all(p.is_dir() for p in live)  # our own parent directory is not stale
        assert manager.cleanup_stale() == 0
    finally:
        orphan.kill()
        orphan.wait()
        for parent in stale:
            for d in (parent / "left-over", parent):
                if d.exists():
                    d.rmdir()
