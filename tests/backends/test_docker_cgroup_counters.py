"""A container's cgroup counters read while runc removes its cgroups, one hierarchy at a time.

Under load the host's last sample of a container could land after runc had removed the pids
hierarchy but not the cpuacct one: that sample read `pids.events` as absent, zero, and replaced
the sample taken at the end frame, so a thread bomb's refused thread was reported without its
`processes` violation. Counters only grow; the backend keeps the larger of each
(`CgroupCounters.then`). Here the files are real files laid out as cgroup v1 names them."""

from __future__ import annotations

import shutil
from pathlib import Path

from sandbox.backends.docker.cgroup import CgroupCounters, ContainerCgroup


def _v1_tree(root: Path) -> ContainerCgroup:
    dirs = {name: root / name / "docker" / "c0ffee" for name in ("cpuacct", "memory", "pids")}
    for path in dirs.values():
        path.mkdir(parents=True)
    (dirs["cpuacct"] / "cpuacct.usage").write_text("2500000\n")
    (dirs["memory"] / "memory.max_usage_in_bytes").write_text("10485760\n")
    (dirs["memory"] / "memory.oom_control").write_text("oom_kill_disable 0\noom_kill 0\n")
    (dirs["memory"] / "memory.failcnt").write_text("0\n")
    (dirs["pids"] / "pids.events").write_text("max 3\n")
    return ContainerCgroup(dirs, unified=False)


def test_a_sample_after_the_pids_hierarchy_is_gone_keeps_the_refusals(tmp_path: Path) -> None:
    cgroup = _v1_tree(tmp_path)
    at_end_frame = cgroup.read()
    assert at_end_frame == CgroupCounters(
        cpu_time_ns=2_500_000, memory_peak_bytes=10 * 2**20, pids_max_events=3
    )
    shutil.rmtree(tmp_path / "pids")  # runc removed this hierarchy first
    (tmp_path / "cpuacct" / "docker" / "c0ffee" / "cpuacct.usage").write_text("2600000\n")
    after_exit = cgroup.read()
    assert after_exit is not None and after_exit.pids_max_events == 0  # what the read sees
    kept = at_end_frame.then(after_exit)
    assert kept == CgroupCounters(
        cpu_time_ns=2_600_000, memory_peak_bytes=10 * 2**20, pids_max_events=3
    )
    shutil.rmtree(tmp_path / "cpuacct")
    assert cgroup.read() is None  # the container is gone: no sample at all


def test_later_samples_only_raise_counters() -> None:
    early = CgroupCounters(cpu_time_ns=5, oom_kills=1, memory_limit_hits=2, pids_peak=7)
    late = CgroupCounters(cpu_time_ns=9, memory_peak_bytes=4, pids_peak=None)
    assert early.then(late) == CgroupCounters(
        cpu_time_ns=9, memory_peak_bytes=4, oom_kills=1, memory_limit_hits=2, pids_peak=7
    )
