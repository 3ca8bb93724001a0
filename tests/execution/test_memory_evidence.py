"""A guest's report of a `MemoryError` weighed against what the host accounted: the memory
branches of the session's claimed-violation check (`sandbox/execution/evidence.py`), and its
sibling for a refused thread start where no pids cgroup counts the script.

The real backends cannot be made to show every branch on one machine (a memory cgroup that is
there but unread, or absent, is the degraded process backend's world), so these run through the
fake backend: the real session, broker and engine, with a fake guest whose report and whose
`ResourceUsage` the script sets (``usage(...)`` marks the usage accounted, as a read cgroup
would; without it nothing was accounted). The real-sandbox cases are in
tests/execution/test_violation_evidence.py and tests/security/test_sec_forged_reports.py.
"""

from __future__ import annotations

import asyncio

import pytest

from sandbox.backends.fake import FakeBackend
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult

MiB = 1 << 20
LIMIT = 64 * MiB
PEAK = 63 * MiB + 4096
REPORT = 'fail("MemoryError", "")'


def run(script: str) -> ExecutionResult:
    async def scenario() -> ExecutionResult:
        async with Engine(EngineConfig(backends={"process": FakeBackend()})) as engine:
            request = ExecutionRequest(
                script=script, manifest="[]", limits=parse_limit_args([f"memory={LIMIT}"])
            )
            return await engine.execute(request)

    async def bounded() -> ExecutionResult:
        return await asyncio.wait_for(scenario(), 30)

    return asyncio.run(bounded())


def violations(result: ExecutionResult) -> list[tuple[object, ...]]:
    return [
        (v.limit, v.limit_value, v.observed, v.unit, v.action, v.evidence, v.detail)
        for v in result.violations
    ]


def test_memory_error_with_limit_hits_is_the_kernels_refusal() -> None:
    result = run(f"usage(memory_limit_hits=3, peak_memory_bytes={PEAK})\n{REPORT}")
    assert result.status == "limit_exceeded"
    assert violations(result) == [
        (
            "memory",
            LIMIT,
            PEAK,
            "bytes",
            "refused",
            "kernel",
            "an allocation was refused; the memory cgroup reached its limit 3 times",
        )
    ]
    assert result.error is not None and result.error.type == "MemoryError"


def test_memory_error_with_no_limit_hit_is_the_scripts_own_error() -> None:
    # The cgroup was read and never reached its limit: whatever raised MemoryError, no limit
    # refused anything, so the report is the script's failure and nothing more.
    result = run(f"usage(memory_limit_hits=0, peak_memory_bytes={PEAK})\n{REPORT}")
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("MemoryError", 2)


def test_memory_error_without_a_memory_cgroup_is_the_guests_word() -> None:
    # No cgroup accounted anything (RLIMIT_AS alone, the degraded process backend): only the
    # guest saw the refusal, so the violation says so and measures nothing.
    result = run(REPORT)
    assert result.status == "limit_exceeded"
    assert violations(result) == [
        (
            "memory",
            LIMIT,
            None,
            "bytes",
            "refused",
            "guest",
            "the script reported a MemoryError under the address-space rlimit",
        )
    ]


@pytest.mark.parametrize(
    "script",
    [
        # The fake guest reports the line of its `fail`: here that line is also a `raise`.
        f"{REPORT}; raise MemoryError",
        f"{REPORT}; raise MemoryError(\n    'out of memory'\n)",
    ],
    ids=["raise-on-the-reported-line", "multiline-raise-starting-there"],
)
def test_memory_error_reported_at_the_scripts_raise_is_no_violation(script: str) -> None:
    result = run(script)
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("MemoryError", 1)


def test_a_raise_elsewhere_does_not_hide_the_guests_report() -> None:
    # Only the reported line counts: a `raise` the report does not point at proves nothing.
    result = run(f"{REPORT}\nraise MemoryError")
    assert [(v.limit, v.evidence, v.observed) for v in result.violations] == [
        ("memory", "guest", None)
    ]


def test_an_oom_kill_is_reported_once_from_the_kernels_event() -> None:
    result = run(
        f"usage(oom_killed=True, memory_limit_hits=5, peak_memory_bytes={LIMIT})\n{REPORT}"
    )
    assert [(v.limit, v.observed, v.action, v.evidence) for v in result.violations] == [
        ("memory", LIMIT, "killed", "kernel")
    ]


def test_thread_start_refused_without_a_pids_cgroup_is_the_guests_word() -> None:
    # The fake sandbox has no pids cgroup (like the degraded process backend, or gVisor, where
    # RLIMIT_NPROC refuses): the script's report of a refused thread is the only witness.
    result = run('fail("RuntimeError", "can\'t start new thread")')
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.observed, v.unit, v.action, v.evidence) for v in result.violations] == [
        ("processes", None, "count", "refused", "guest")
    ]


def test_fork_refused_without_a_pids_cgroup_is_the_guests_word() -> None:
    # The bootstrap marks an EAGAIN that came out of a process start under the job's
    # RLIMIT_NPROC (`refused_by`): with no pids cgroup, that report is the only witness.
    result = run(
        'fail("BlockingIOError", "[Errno 11] Resource temporarily unavailable",'
        ' errno="EAGAIN", refused_by="RLIMIT_NPROC")'
    )
    assert result.status == "limit_exceeded"
    assert violations(result) == [
        (
            "processes",
            64,
            None,
            "count",
            "refused",
            "guest",
            "the script reported a process start refused at the limit",
        )
    ]


@pytest.mark.parametrize(
    "fields",
    [
        # Non-blocking I/O raises the same error: without the mark it is no refusal.
        'errno="EAGAIN"',
        # The mark on another error, or on another errno, claims nothing.
        'errno="EWOULDBLOCK_", refused_by="RLIMIT_NPROC"',
    ],
    ids=["eagain-unmarked", "other-errno"],
)
def test_eagain_that_no_process_start_raised_is_no_violation(fields: str) -> None:
    result = run(
        f'fail("BlockingIOError", "[Errno 11] Resource temporarily unavailable", {fields})'
    )
    assert (result.status, result.violations) == ("error", [])
