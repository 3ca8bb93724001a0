"""Threads are not memory: where the memory limit is RLIMIT_AS (the degraded process
backend: no memory cgroup, as in the Kubernetes base), a script may start threads up to its
`processes` limit, and a refused thread start names the limit that refused it.

The backend runs with cgroups turned off (`cgroups=False`), exactly the degraded mode of a host
whose cgroups are read-only: RLIMIT_AS for memory, RLIMIT_NPROC for processes. Before the guest
made room (`sandbox/guest/_threads.py`) each thread reserved an 8 MiB stack and a 64 MiB malloc
arena, and under 256 MiB the fourth thread failed as a `processes` violation."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def degraded() -> Iterator[EngineHarness]:
    h = EngineHarness(pool_size=1, allow_degraded=True, cgroups=False)
    yield h
    h.close()
    assert not psutil.Process().children(recursive=True), "sandbox processes survived close()"


THREADS_AND_SUBPROCESSES = """
import subprocess, sys, threading
go = threading.Event()
threads = [threading.Thread(target=go.wait) for _ in range({threads})]
for t in threads:
    t.start()
children = [
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    for _ in range({children})
]
go.set()
for t in threads:
    t.join()
print(len(threads), [c.wait() for c in children])
"""

# Starts threads until one is refused; prints how many started, then re-raises the refusal so
# the guest reports it.
UNTIL_REFUSED = """
import threading
go = threading.Event()
started = []
try:
    while len(started) < {most}:
        t = threading.Thread(target=go.wait)
        t.start()
        started.append(t)
except RuntimeError:
    print(len(started))
    go.set()
    raise
go.set()
print(len(started), "all")
"""


def test_the_issues_script_runs_under_256_mib(degraded: EngineHarness) -> None:
    result = degraded.run(
        THREADS_AND_SUBPROCESSES.format(threads=8, children=4), limits={"memory": 256 * MIB}
    )
    assert (result.status, result.stdout, result.violations) == ("ok", "8 [0, 0, 0, 0]\n", [])
    assert "cgroup:memory" not in result.isolation  # the degraded mode, for real


def test_threads_up_to_the_processes_limit_at_the_default_memory(degraded: EngineHarness) -> None:
    # 48 threads: the processes limit (64) less what the other sandboxes of the pool and this
    # one's pid 1 count against the same RLIMIT_NPROC (one uid).
    result = degraded.run(
        THREADS_AND_SUBPROCESSES.format(threads=48, children=0), limits={"memory": 256 * MIB}
    )
    assert (result.status, result.stdout, result.violations) == ("ok", "48 []\n", [])


def test_a_thread_refused_for_address_space_is_a_memory_violation(
    degraded: EngineHarness,
) -> None:
    # 1024 processes allowed, 64 MiB of address space: the address space runs out first.
    result = degraded.run(
        UNTIL_REFUSED.format(most=1000), limits={"memory": 64 * MIB, "processes": 1024}
    )
    assert result.status == "limit_exceeded", result.to_json()
    started = int(result.stdout.split()[0])
    assert 20 < started < 1000
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence) == (
        "memory",
        "refused",
        "guest",
    )
    assert violation.limit_value == 64 * MIB
    assert "address-space rlimit (RLIMIT_AS)" in violation.detail
    degraded.assert_healthy()


def test_a_thread_refused_at_the_process_count_is_a_processes_violation(
    degraded: EngineHarness,
) -> None:
    result = degraded.run(
        UNTIL_REFUSED.format(most=100), limits={"memory": 1024 * MIB, "processes": 16}
    )
    assert result.status == "limit_exceeded", result.to_json()
    assert int(result.stdout.split()[0]) < 16
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence) == (
        "processes",
        "refused",
        "guest",
    )
    assert violation.limit_value == 16
    degraded.assert_healthy()
