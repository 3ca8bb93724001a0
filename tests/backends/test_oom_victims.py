"""How the host ties the enclosing cgroup's OOM kills to a sandbox's processes
(`sandbox.backends.process.oom_victims`), step by step, on a real process tree walked by the real
meter.

A real OOM kill cannot be placed at a chosen instant of a walk, so the counter here is a real
`oom_kill` file (the v2 ``memory.events`` format `EnclosingOomCounter` reads) that the test
raises, then kills the process, in the kernel's own order: the kill is counted before its SIGKILL
is sent. `tests/backends/test_enclosing_oom.py` and `tests/deploy/test_kubernetes_pod_oom.py` run
the kernel's OOM killer itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.backends.process.cgroups.enclosing_oom import EnclosingOomCounter
from sandbox.backends.process.host_meter import ProcessTreeMeter
from sandbox.backends.process.oom_victims import OomVictims

# The tree's first process starts two children and reaps them as they end, as a script's
# `subprocess.run` does: a killed child's status never leaves the tree.
TREE = """
import os, subprocess, sys
children = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
print(*(child.pid for child in children), flush=True)
for _ in children:
    os.wait()
sys.stdin.read()
"""


class _Tree:
    def __init__(self, tmp: Path) -> None:
        self.events = tmp / "memory.events"
        self.events.write_text("oom 0\noom_kill 0\n")
        self.process = subprocess.Popen(
            [sys.executable, "-c", TREE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.children = [int(pid) for pid in self.process.stdout.readline().split()]
        self.meter = ProcessTreeMeter(self.process.pid)
        self.victims = OomVictims(
            EnclosingOomCounter([self.events]), self.process.pid, reaper=False
        )
        self.sample()
        assert self.meter.last.pids == {self.process.pid, *self.children}

    def sample(self) -> None:
        """One host-accounting sample, as `ProcessSandbox.usage` takes it."""
        self.victims.walked(self.meter.sample().pids)

    def count_kill(self) -> None:
        kills = int(self.events.read_text().split("oom_kill ")[1]) + 1
        self.events.write_text(f"oom 1\noom_kill {kills}\n")

    def end(self, pid: int, counted: bool) -> None:
        """Ends ``pid`` with SIGKILL, counted first as the kernel does when ``counted``, and
        waits until its parent has reaped it."""
        if counted:
            self.count_kill()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline, f"{pid} was not reaped"
            time.sleep(0.01)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[_Tree]:
    made = _Tree(tmp_path)
    try:
        yield made
    finally:
        with made.process:  # closes its pipes too
            made.process.kill()
        for child in made.children:
            if Path(f"/proc/{child}").exists():
                os.kill(child, signal.SIGKILL)


def test_a_victim_gone_before_the_walk_that_follows_its_kill_is_taken(tree: _Tree) -> None:
    """A child killed and reaped since the last sample: the walk finds it gone, and the reading
    after the walk holds its kill. When the host read the counter before its walk, a kill that
    landed between that reading and the walk was lost (the walk saw the child gone, the reading
    no rise, the next reading a rise and nothing gone): a loaded pod's CI run lost a child's
    kill so. Reading after the walk leaves no such gap, which this sequence holds."""
    tree.end(tree.children[0], counted=True)
    tree.sample()
    assert tree.victims.victims == 1
    assert tree.victims.kills_since_start() == 1
    tree.sample()
    assert tree.victims.victims == 1  # one kill, one victim


def test_a_kill_counted_while_its_victim_still_runs_is_taken_when_it_goes(tree: _Tree) -> None:
    """A victim exits only once it is scheduled: the rise waits for the next walks."""
    tree.count_kill()
    tree.sample()
    assert tree.victims.victims == 0
    tree.end(tree.children[1], counted=False)
    tree.sample()
    assert tree.victims.victims == 1


def test_a_process_that_ends_with_no_kill_counted_is_no_victim(tree: _Tree) -> None:
    tree.end(tree.children[0], counted=False)
    tree.sample()
    tree.sample()
    assert (tree.victims.victims, tree.victims.kills_since_start()) == (0, 0)


FREEZER_V1 = Path("/sys/fs/cgroup/freezer")


def test_a_victim_that_cannot_exit_yet_is_taken_by_its_pending_sigkill(tree: _Tree) -> None:
    """A victim stuck in the kernel (here: frozen by a cgroup v1 freezer, where a SIGKILL waits
    until the thaw) is taken while its SIGKILL is pending, however long it takes to go, and
    only once when it goes."""
    if not os.access(FREEZER_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 freezer hierarchy to hold a killed process")
    group = FREEZER_V1 / f"ptc-test-victim-{os.getpid()}"
    group.mkdir()
    victim = tree.children[0]
    try:
        (group / "cgroup.procs").write_text(str(victim))
        (group / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 10
        while (group / "freezer.state").read_text().strip() != "FROZEN":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        tree.count_kill()
        os.kill(victim, signal.SIGKILL)
        for _ in range(5):  # past the window: it is still there, and so is its SIGKILL
            tree.sample()
            time.sleep(0.1)
        assert victim in tree.meter.last.pids
        assert tree.victims.victims == 1
        (group / "freezer.state").write_text("THAWED")
        tree.end(victim, counted=False)
        tree.sample()
        assert tree.victims.victims == 1
    finally:
        (group / "freezer.state").write_text("THAWED")
        time.sleep(0.1)
        for pid in (group / "cgroup.procs").read_text().split():
            (FREEZER_V1 / "cgroup.procs").write_text(pid)
        group.rmdir()
