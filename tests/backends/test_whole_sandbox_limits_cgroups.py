"""Whole-sandbox limits on the process backend's default path, where cgroups
are writable: a cgroup per sandbox enforces memory, CPU time and processes for the sandbox as a
whole, with the kernel as evidence (the degraded mode's host accounting and threads:
tests/backends/test_host_accounting.py, test_degraded_threads.py; in the Kubernetes base's
container: tests/deploy/test_kubernetes_variants.py)."""

from __future__ import annotations

import asyncio

import pytest

from sandbox.engine import ExecutionRequest
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult
from tests.backends.test_degraded_threads import THREADS_AND_SUBPROCESSES
from tests.backends.test_host_accounting import BURNERS, HOLDERS
from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

MIB = 1024 * 1024
FORK_BOMB = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
    except BlockingIOError:
        raise
"""


def _side_by_side(
    h: EngineHarness, first: ExecutionRequest, second: ExecutionRequest
) -> tuple[ExecutionResult, ExecutionResult]:
    async def both() -> tuple[ExecutionResult, ExecutionResult]:
        a, b = await asyncio.gather(h.engine.execute(first), h.engine.execute(second))
        return a, b

    return h.call(both())


def _request(script: str, **limits: object) -> ExecutionRequest:
    return ExecutionRequest(
        script=script, limits=parse_limit_args(f"{k}={v}" for k, v in limits.items())
    )


@pytest.fixture
def cgrouped(clean: EngineHarness) -> EngineHarness:
    if clean.backend.cgroups is None:
        pytest.skip("needs writable cgroups: the default path these tests check")
    return clean


def test_threads_and_subprocesses_under_256_mib(cgrouped: EngineHarness) -> None:
    result = cgrouped.run(
        THREADS_AND_SUBPROCESSES.format(threads=8, children=4), limits={"memory": 256 * MIB}
    )
    assert (result.status, result.stdout, result.violations) == ("ok", "8 [0, 0, 0, 0]\n", [])
    assert "limit:memory=cgroup" in result.isolation


def test_a_fork_bomb_beside_threads_touches_only_itself(cgrouped: EngineHarness) -> None:
    bomb, other = _side_by_side(
        cgrouped,
        _request(FORK_BOMB, processes=64),
        _request(THREADS_AND_SUBPROCESSES.format(threads=8, children=4)),
    )
    assert (other.status, other.stdout, other.violations) == ("ok", "8 [0, 0, 0, 0]\n", [])
    assert bomb.status == "limit_exceeded", bomb.to_json()
    assert [(v.limit, v.evidence) for v in bomb.violations] == [("processes", "kernel")]


def test_four_processes_of_200_mib_under_256_mib(cgrouped: EngineHarness) -> None:
    result = cgrouped.run(
        HOLDERS.format(n=4, mib=200, hold_s=5), limits={"memory": 256 * MIB, "wall_time": 20}
    )
    assert result.status == "limit_exceeded", result.to_json()
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence) == (
        "memory",
        "killed",
        "kernel",
    )


def test_four_cpu_burners_under_one_second(cgrouped: EngineHarness) -> None:
    result = cgrouped.run(BURNERS.format(n=4, burn_s=5), limits={"cpu_time": 1, "wall_time": 20})
    assert result.status == "limit_exceeded", result.to_json()
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence) == (
        "cpu_time",
        "killed",
        "kernel",
    )
    assert violation.observed is not None and 1 <= violation.observed < 1.5
