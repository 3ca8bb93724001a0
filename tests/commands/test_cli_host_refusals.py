"""A host that cannot give `ptc` a thread or a process ends the command with one line and the
resource-exhausted exit code (11), never a traceback (issue 39: under gVisor, `ptc run` ended in
`RuntimeError: can't start new thread` from asyncio's default executor).

The refusal is real: the command runs in a pids cgroup of its own whose `pids.max` lets it start
only so many tasks. Each step of the ladder starves a different start (the first thread, asyncio's
executor at shutdown, bwrap's namespaces, the fork server, a version probe's subprocess); every one
must end in a single `ptc run: ...` line with 11 (the host's threads or processes) or 12 (the
backend reports it cannot start its sandbox), or run (a warm pool's refused refill is then only
logged), and enough of them must let it run."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ptc_cli import PYTHON, ROOT

pytestmark = pytest.mark.requires_bwrap

PIDS_V1 = Path("/sys/fs/cgroup/pids")


def _pids_parent() -> Path | None:
    """A cgroup directory where this test may create a pids cgroup (v1 hierarchy, or the v2
    unified root with the pids controller delegated), or None."""
    if (PIDS_V1 / "cgroup.procs").exists() and os.access(PIDS_V1, os.W_OK):
        return PIDS_V1
    root = Path("/sys/fs/cgroup")
    controllers = root / "cgroup.subtree_control"
    if controllers.exists() and "pids" in controllers.read_text().split():
        return root if os.access(root, os.W_OK) else None
    return None


@pytest.fixture
def pids_cgroup() -> Iterator[Path]:
    parent = _pids_parent()
    if parent is None:
        pytest.skip("needs a writable pids cgroup to make the host refuse threads for real")
    group = parent / f"ptc-test-refusal-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        yield group
    finally:
        group.rmdir()  # every task of the command has exited: communicate() waited for it


def _run_in(group: Path, pids_max: int) -> subprocess.CompletedProcess[str]:
    (group / "pids.max").write_text(str(pids_max))
    env = {k: v for k, v in os.environ.items() if k not in ("PTC_AUDIT_DB", "PTC_SERVER")}
    # The shell joins the cgroup, then becomes ptc: every task ptc starts is counted there.
    command = f'echo $$ > {group}/cgroup.procs && exec "$0" -m sandbox.cli "$@"'
    return subprocess.run(
        ["sh", "-c", command, PYTHON, "run", "-", "--allow-degraded", "--json"],
        input="print(6 * 7)",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_no_thread_for_the_command_is_one_line_and_exit_11(pids_cgroup: Path) -> None:
    done = _run_in(pids_cgroup, 1)
    assert done.returncode == 11, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        "ptc run: resource exhausted: the host could not start a thread for this command"
        " (can't start new thread): its process and thread limit (RLIMIT_NPROC, a pids"
        " cgroup) or its memory is used up\n"
    )


def test_every_starved_start_ends_in_one_line(pids_cgroup: Path) -> None:
    codes = set()
    for pids_max in range(1, 10):
        done = _run_in(pids_cgroup, pids_max)
        codes.add(done.returncode)
        assert "Traceback" not in done.stderr, (pids_max, done.stderr)
        if done.returncode == 0:
            # Enough for the run itself; a warm pool's refill refused meanwhile is logged.
            assert '"stdout": "42\\n"' in done.stdout, (pids_max, done.stderr)
            continue
        assert done.returncode in (11, 12), (pids_max, done.stderr)
        assert done.stdout == ""
        # It ends with one line saying why (a refused pool refill may be logged before it).
        said = [line for line in done.stderr.splitlines() if line.startswith("ptc run: ")]
        assert said == done.stderr.splitlines()[-1:], (pids_max, done.stderr)
    assert 11 in codes
    # Enough tasks, and the same command runs: the refusals above were the cgroup's.
    done = _run_in(pids_cgroup, 64)
    assert done.returncode == 0, done.stderr
    assert '"stdout": "42\\n"' in done.stdout
