"""`max_sandboxes` fitted into the memory limit the server runs under (`memory_budget`).

The served tests put a real `ptc serve` into a memory cgroup of their own (created below the
test's cgroup, limit set, removed afterwards) and read what the server says and does; the
arithmetic itself is checked on figures."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.process.cgroups.discovery import own_dirs
from sandbox.backends.process.cgroups.own_memory import OwnMemory, own_memory
from sandbox.client import Client
from sandbox.errors import InvalidArgument
from sandbox.limits import CEILINGS
from sandbox.server.memory_budget import HEADROOM_BYTES, fit_max_sandboxes
from tests.ptc_serve import PYTHON, ROOT, ptc_serve

MIB = 1024**2
GIB = 1024**3
SERVE_ARGS = ("--listen", "127.0.0.1:0", "--audit-db", "memory")


def _limit(limit_gib: int, usage_mib: int | None) -> OwnMemory:
    return OwnMemory(
        limit_gib * GIB, Path("/sys/fs/cgroup/x/memory.max"), usage_mib and usage_mib * MIB
    )


def test_no_limit_keeps_the_configured_count() -> None:
    fit = fit_max_sandboxes(64, 8 * GIB, None)
    assert (fit.max_sandboxes, fit.requested) == (64, 64)


def test_a_limit_that_holds_every_sandbox_keeps_the_count() -> None:
    # The Kubernetes base: 12 x 256 MiB under 4 GiB, the server using 300 MiB.
    fit = fit_max_sandboxes(12, 256 * MIB, _limit(4, 300))
    assert fit.max_sandboxes == 12
    assert fit.own_bytes == 300 * MIB + HEADROOM_BYTES


def test_a_tighter_limit_lowers_the_count_to_what_fits() -> None:
    # (4096 - 300 - 256) MiB / 256 MiB = 13.8: 13 of the 64 asked for.
    assert fit_max_sandboxes(64, 256 * MIB, _limit(4, 300)).max_sandboxes == 13


def test_a_limit_without_room_for_one_sandbox_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(InvalidArgument) as raised:
        fit_max_sandboxes(64, 8 * GIB, _limit(6, 100))
    assert raised.value.message == (
        "max_sandboxes: not one sandbox fits in the server's memory limit: "
        "/sys/fs/cgroup/x/memory.max allows 6144 MiB; the server uses 356 MiB (100 MiB now plus "
        "256 MiB headroom), and one sandbox may take 8192 MiB (the largest tenant memory "
        "ceiling); raise the limit or lower the tenants' memory ceiling (ceilings.memory)"
    )


def _memory_cgroup_parent() -> tuple[Path, str] | None:
    """Where a test may create a memory cgroup, and the file that sets its limit."""
    v1 = own_dirs("memory")
    if v1 is not None:
        return v1[0], "memory.limit_in_bytes"
    v2 = own_dirs("")
    if v2 is None or not (v2[0] / "cgroup.subtree_control").exists():
        return None
    controls = (v2[0] / "cgroup.subtree_control").read_text().split()
    return (v2[0], "memory.max") if "memory" in controls else None


@pytest.fixture
def memory_cgroup() -> Iterator[tuple[Path, str]]:
    """A fresh memory cgroup of this test's (its directory, its limit file), removed after."""
    parent = _memory_cgroup_parent()
    if parent is None or own_memory() is not None:
        pytest.skip("needs a writable memory cgroup and no memory limit over the tests")
    path = parent[0] / f"ptc-test-budget-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup at {path}: {exc.strerror}")
    try:
        yield path, parent[1]
    finally:
        # A server that stopped removed its sandboxes' cgroups; one killed (a failed test) left
        # them, empty once its processes are gone: removed deepest first, so none outlives us.
        leftovers = sorted((d for d in path.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for cgroup in [*leftovers, path]:
            cgroup.rmdir()
    assert not path.exists()
    assert leftovers == [], f"the server left cgroups behind: {leftovers}"


def _into(cgroup: Path) -> list[str]:
    """A wrapper that moves itself into ``cgroup`` and then execs the server."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup)]


def test_served_max_sandboxes_is_lowered_and_the_server_says_why(
    memory_cgroup: tuple[Path, str],
) -> None:
    path, limit_file = memory_cgroup
    (path / limit_file).write_text(str(20 * GIB))
    # The single tenant's ceiling is CEILINGS' 8 GiB: 2 fit under 20 GiB beside the server.
    assert CEILINGS.memory_bytes == 8 * GIB
    with ptc_serve("--audit-db", "memory", wrapper=_into(path)) as serving:
        with Client(serving.address) as client:
            result = client.execute("print(6 * 7)")
        assert result.stdout == "42\n"
    assert "max_sandboxes: lowered from 64 to 2 so that every sandbox fits: " in serving.stderr
    assert f"{path / limit_file} allows 20480 MiB" in serving.stderr


def test_served_without_room_for_one_sandbox_refuses_to_start(
    memory_cgroup: tuple[Path, str],
) -> None:
    path, limit_file = memory_cgroup
    (path / limit_file).write_text(str(6 * GIB))
    done = subprocess.run(
        [*_into(path), PYTHON, "-m", "sandbox.cli", "serve", *SERVE_ARGS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == InvalidArgument("").exit_code
    assert "max_sandboxes: not one sandbox fits in the server's memory limit: " in done.stderr
    assert f"{path / limit_file} allows 6144 MiB" in done.stderr
    assert "one sandbox may take 8192 MiB" in done.stderr
    assert done.stdout == ""  # it never listened
