"""Each result's `isolation` names what enforces each whole-sandbox limit, on the
default path: where cgroups are writable the process backend's cgroup enforces them and the
host sums nothing (the degraded mode's entries: tests/backends/test_host_accounting.py)."""

from __future__ import annotations

import pytest

from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap


def test_with_cgroups_the_cgroup_enforces_and_the_host_does_not_sum(clean: EngineHarness) -> None:
    if clean.backend.cgroups is None:
        pytest.skip("needs writable cgroups: the default path this test checks")
    result = clean.run("print(1)")
    assert result.status == "ok"
    assert "host:accounting" not in result.isolation
    assert [i for i in result.isolation if i.startswith("limit:")] == [
        "limit:memory=cgroup",
        "limit:cpu_time=cgroup+rlimit",
        "limit:processes=cgroup",
    ]
