"""Pairs around every limit, on every backend: just under passes, just over fails with the
right violation (limit, value, action) and the right observable effect.

Each case is one limit, a script parametrised by a size, the size just under and just over,
and the violation the over case must produce. Nothing here is timed: time limits are tripped by
scripts that would run far longer than the limit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sandbox.limits import SPEC_BY_NAME, parse_limit_args

if TYPE_CHECKING:
    from .conftest import Harness

MiB = 1 << 20

ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
    }
]


@dataclass(frozen=True)
class AtLeast:
    """Equal to any number at least ``value``: a measurement of a time that ran past a limit."""

    value: float

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (int, float)) and other >= self.value


def _pids_peak_kept() -> bool:
    """Whether the kernel keeps pids.peak: cgroup v2 on Linux 6.1 or later."""
    release = tuple(int(p) for p in re.findall(r"\d+", os.uname().release)[:2])
    return Path("/sys/fs/cgroup/cgroup.controllers").exists() and release >= (6, 1)


@dataclass(frozen=True)
class Pair:
    limits: dict[str, int | float]
    script: str  # formatted with n
    under: int
    over: int
    violation: tuple[str, float, str]
    evidence: str  # where the over case's observation comes from
    observed: object  # the measurement the over case reports (None: nothing measured)
    manifest: object = "[]"


PAIRS = {
    "wall_time": Pair(
        {"wall_time": 2},
        "import time\ntime.sleep({n} / 10)\nprint('done')",
        1,
        600,
        ("wall_time", 2.0, "killed"),
        "host",
        AtLeast(2.0),  # the host's clock
    ),
    "cpu_time": Pair(
        {"cpu_time": 1},
        "import time\nwhile time.process_time() < {n} / 10:\n    pass\nprint('done')",
        2,
        600,
        ("cpu_time", 1.0, "killed"),
        "kernel",
        AtLeast(1.0),  # the cgroup's CPU usage
    ),
    "memory": Pair(
        {"memory": 128 * MiB},
        "block = bytearray({n} * 1024 * 1024)\nblock[::4096] = b'x' * len(block[::4096])\nprint('done')",
        64,
        160,
        ("memory", 128 * MiB, "killed"),
        "kernel",
        128 * MiB,  # the cgroup's peak, which is at the limit when the OOM killer acts
    ),
    # The sandbox's init, the guest and its channel thread count too: 3 tasks before the script.
    "processes": Pair(
        {"processes": 24},
        "import threading\nev = threading.Event()\nts = [threading.Thread(target=ev.wait) for _ in range({n})]\n"
        "try:\n    [t.start() for t in ts]\nfinally:\n    ev.set()\nprint('done')",
        16,
        24,
        ("processes", 24, "refused"),
        "kernel",
        24 if _pids_peak_kept() else None,  # pids.peak; cgroup v1 keeps no peak
    ),
    "stdout_bytes": Pair(
        {"stdout_bytes": 1000},
        "import sys\nsys.stdout.write('a' * {n})",
        1000,
        1001,
        ("stdout_bytes", 1000, "truncated"),
        "host",
        1001,  # the bytes the capture counted
    ),
    "stderr_bytes": Pair(
        {"stderr_bytes": 1000},
        "import sys\nsys.stderr.write('a' * {n})",
        1000,
        1001,
        ("stderr_bytes", 1000, "truncated"),
        "host",
        1001,
    ),
    "file_size": Pair(
        {"file_size": MiB},
        "with open('/tmp/f', 'wb') as f:\n    f.write(b'f' * {n})\nprint('done')",
        MiB,
        MiB + 1,
        ("file_size", MiB, "refused"),
        "host",
        MiB,  # the sandbox's /tmp, full: the file, as large as the limit, fills it
    ),
    "max_tool_calls": Pair(
        {"max_tool_calls": 20},
        "import tools\nfor i in range({n}):\n    tools.echo(i=i)\nprint('done')",
        20,
        21,
        ("max_tool_calls", 20, "refused"),
        "host",
        21,  # the calls the broker saw: 20 done, 1 refused
        ECHO,
    ),
    # stdin, stdout, stderr and the channel are open before the script runs.
    "open_files": Pair(
        {"open_files": 64},
        "files = [open('/dev/null') for _ in range({n})]\nprint('done')",
        56,
        64,
        ("open_files", 64, "refused"),
        "guest",  # no kernel counter: only the guest saw EMFILE
        None,
    ),
}


@pytest.mark.parametrize("name", list(PAIRS))
def test_just_under_passes(clean: Harness, name: str) -> None:
    pair = PAIRS[name]
    result = clean.run(pair.script.format(n=pair.under), limits=pair.limits, manifest=pair.manifest)
    assert (result.status, result.exit_code, result.violations) == ("ok", 0, []), result.stderr
    # Results carry the resolved limits, in canonical units.
    requested = parse_limit_args([f"{name}={pair.limits[name]}"])
    field = SPEC_BY_NAME[name].field
    assert result.effective_limits is not None
    assert getattr(result.effective_limits, field) == getattr(requested, field)


@pytest.mark.parametrize("name", list(PAIRS))
def test_just_over_fails_with_the_right_violation(clean: Harness, name: str) -> None:
    pair = PAIRS[name]
    result = clean.run(pair.script.format(n=pair.over), limits=pair.limits, manifest=pair.manifest)
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.limit_value, v.action) for v in result.violations] == [pair.violation]
    expected = (pair.evidence, pair.observed)
    if clean.name == "gvisor" and name == "file_size":
        # gVisor's /tmp is its sentry's own tmpfs, which the host cannot measure (fstatvfs
        # through /proc/<pid>/root sees the container's mount, not gVisor's): only the guest saw
        # EFBIG, and the violation says so.
        expected = ("guest", None)
    if clean.name == "gvisor" and name == "processes":
        # The script's tasks are counted by gVisor's kernel (RLIMIT_NPROC), not by the host's
        # pids cgroup, which holds gVisor itself: only the guest saw the refusal.
        expected = ("guest", None)
    assert (result.violations[0].evidence, result.violations[0].observed) == expected
    assert "done" not in result.stdout or name.endswith("_bytes")
    clean.assert_healthy()


def test_truncation_marker_counts_the_dropped_bytes(clean: Harness) -> None:
    result = clean.run("import sys\nsys.stdout.write('a' * 1001)", limits={"stdout_bytes": 1000})
    assert result.stdout == "a" * 1000 + (
        "\n[ptc: stdout truncated: 1 bytes dropped of 1001; the cap is 1000 bytes]\n"
    )
    violation = result.violations[0]
    assert (violation.observed, violation.unit, violation.detail) == (
        1001,
        "bytes",
        "1 bytes dropped",
    )
