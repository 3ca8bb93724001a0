"""Each violation says where its observation came from (`evidence`), and `observed` is a
measurement or absent: the kinds of evidence the limit pairs do not show, and the JSON contract
of `ptc run --json`.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.expectations import ExpectedCalls
from tests.memory_peaks import assert_memory_kill_peak

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

MiB = 1 << 20
ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
    }
]


def test_protocol_kill_is_host_evidence_with_nothing_measured(clean: EngineHarness) -> None:
    script = "import os, struct, sys\nos.write(int(sys.argv[1]), struct.pack('>I', 2) + b'{]')"
    result = clean.run(script)
    assert [(v.limit, v.action, v.evidence, v.observed) for v in result.violations] == [
        ("protocol", "killed", "host", None)
    ]
    clean.assert_healthy()


def test_expected_calls_shortfall_is_reported_from_the_call_log(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntools.echo(i=1)",
        manifest=ECHO,
        expected_calls=(ExpectedCalls("echo", min=3),),
    )
    assert result.status == "limit_exceeded"
    assert [
        (v.limit, v.limit_value, v.observed, v.action, v.evidence) for v in result.violations
    ] == [("expected_calls", 3, 1, "reported", "host")]


def test_full_dev_shm_is_measured_by_the_host(clean: EngineHarness) -> None:
    result = clean.run(
        "i = 0\nwhile True:\n    with open(f'/dev/shm/f{i}', 'wb') as f:\n"
        "        f.write(b'd' * (1 << 20))\n    i += 1",
        limits={"file_size": 4 * MiB},
    )
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence, violation.observed) == (
        "file_size",
        "refused",
        "host",
        4 * MiB,
    )
    assert "/dev/shm was full (4194304 of 4194304 bytes)" in violation.detail


def test_fork_bomb_refusals_are_counted_by_the_kernel(clean: EngineHarness) -> None:
    result = clean.run(
        "import threading, time\nthreads = []\nwhile True:\n"
        "    t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n"
        "    t.start()\n    threads.append(t)",
        limits={"processes": 16},
    )
    [violation] = result.violations
    assert (violation.limit, violation.action, violation.evidence) == (
        "processes",
        "refused",
        "kernel",
    )
    refused = int(violation.detail.split()[3])
    assert refused >= 1
    assert violation.detail == (
        f"the kernel refused {refused} process or thread creations at the limit"
    )
    clean.assert_healthy()


def test_oom_kill_then_a_raised_memory_error_is_one_kernel_violation(
    clean: EngineHarness,
) -> None:
    # A child dies of the OOM killer; the parent then raises MemoryError itself. The kernel's
    # event is the violation, with the cgroup's peak; the report adds nothing to it.
    result = clean.run(
        "import os\nif os.fork() == 0:\n    b = bytearray(200 * 1024 * 1024)\n"
        "    b[::4096] = b'x' * len(b[::4096])\n    os._exit(0)\nos.wait()\nraise MemoryError",
        limits={"memory": 128 * MiB},
    )
    assert [(v.limit, v.action, v.evidence) for v in result.violations] == [
        ("memory", "killed", "kernel")
    ]
    assert_memory_kill_peak(result.violations[0].observed, 128 * MiB, "process")


@pytest.fixture
def private_tmp() -> Iterator[dict[str, str]]:
    private = Path(tempfile.mkdtemp(prefix="evidence-", dir="/tmp"))
    private.chmod(0o755)  # the sandbox's uid must reach the runtime dir created in it
    yield {"TMPDIR": str(private)}
    left = list(private.iterdir())
    shutil.rmtree(private)
    assert left == []


def test_json_result_carries_evidence_and_null_observed(
    ptc: Any, private_tmp: dict[str, str]
) -> None:
    script = "files = [open('/dev/null') for _ in range(64)]"
    proc = ptc("run", "-", "--limit", "open_files=32", "--json", stdin=script, env=private_tmp)
    out = json.loads(proc.stdout)
    assert out["status"] == "limit_exceeded"
    assert out["violations"] == [
        {
            "limit": "open_files",
            "limit_value": 32,
            "observed": None,
            "unit": "count",
            "action": "refused",
            "detail": "the script reported an open that failed with EMFILE",
            "evidence": "guest",
        }
    ]
