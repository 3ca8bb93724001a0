"""The evidence policy (`sandbox.execution.evidence`) row by row, without a sandbox.

One test (or one table) per row of the evidence table in docs/limits.md, and one per forged
report it names: each builds the plain observations a drive loop would gather and asserts the
exact violation (limit, observed, action, evidence), or that there is none. The same rules in
a real sandbox are tests/conformance, tests/security/test_sec_forged_reports.py and
tests/execution/test_violation_evidence.py.
"""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any

import pytest

from sandbox.backends.base import ResourceUsage, TmpfsUsage
from sandbox.execution import evidence
from sandbox.execution.evidence import Capture, Observations
from sandbox.execution.outputs import OutputCollector
from sandbox.expectations import ExpectedCalls, check_expected_calls
from sandbox.limits import DEFAULTS
from sandbox.protocol import GuestOmit, GuestOutput
from sandbox.result import CallRecord, CallStatus, Evidence, Violation

LIMITS = DEFAULTS
MiB = 1 << 20
CGROUP = ResourceUsage(accounted=True, cpu_time_s=0.5, peak_memory_bytes=40 * MiB)
FULL_TMP = TmpfsUsage("/tmp", LIMITS.file_size_bytes, LIMITS.file_size_bytes, 0)
ROOMY_TMP = TmpfsUsage("/tmp", 4096, LIMITS.file_size_bytes, LIMITS.file_size_bytes - 4096)


def seen(**fields: Any) -> Observations:
    return Observations(limits=LIMITS, **fields)


def only(found: list[Violation]) -> Violation:
    assert len(found) == 1, found
    return found[0]


def report(kind: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": kind, "message": message, "line": 1, **extra}


# -- wall_time ---------------------------------------------------------------------------------
def test_wall_time_is_the_hosts_clock_at_the_kill() -> None:
    v = only(evidence.violations(seen(killed_for="wall_time", wall_time_s=2.00049, exit_code=-9)))
    assert (v.limit, v.limit_value, v.observed, v.unit, v.action, v.evidence) == (
        "wall_time", LIMITS.wall_time_ms / 1000, 2.0, "s", "killed", Evidence.HOST
    )  # fmt: skip


# -- cpu_time ----------------------------------------------------------------------------------
def test_cpu_time_watchdog_reports_the_cgroups_usage() -> None:
    used = replace(CGROUP, cpu_time_s=3.14159)
    v = only(evidence.violations(seen(killed_for="cpu_time", resources=used, exit_code=-9)))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "cpu_time", 3.142, "killed", Evidence.KERNEL
    )  # fmt: skip


def test_cpu_time_without_a_readable_cgroup_observes_nothing() -> None:
    v = only(evidence.violations(seen(exit_code=-signal.SIGXCPU)))
    assert (v.limit, v.observed, v.evidence) == ("cpu_time", None, Evidence.KERNEL)


def test_sigxcpu_with_the_usage_past_the_limit_is_the_kernels() -> None:
    used = replace(CGROUP, cpu_time_s=LIMITS.cpu_time_ms / 1000)
    v = only(evidence.violations(seen(exit_code=128 + signal.SIGXCPU, resources=used)))
    assert (v.limit, v.action, v.evidence) == ("cpu_time", "killed", Evidence.KERNEL)


def test_a_sigxcpu_the_script_sent_itself_is_no_violation() -> None:
    assert evidence.violations(seen(exit_code=-signal.SIGXCPU, resources=CGROUP)) == []


# -- memory ------------------------------------------------------------------------------------
def test_memory_oom_kill_reports_the_cgroups_peak() -> None:
    used = replace(CGROUP, oom_killed=True)
    found = evidence.violations(seen(exit_code=-9, resources=used, report=report("MemoryError")))
    v = only(found)  # the report adds nothing to the kernel's own event
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "memory", 40 * MiB, "killed", Evidence.KERNEL
    )  # fmt: skip


def test_memory_error_while_failcnt_rose_is_the_kernels() -> None:
    used = replace(CGROUP, memory_limit_hits=3)
    v = only(evidence.violations(seen(exit_code=1, resources=used, report=report("MemoryError"))))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "memory", 40 * MiB, "refused", Evidence.KERNEL
    )  # fmt: skip
    assert "3 times" in v.detail


def test_memory_error_the_cgroup_did_not_see_is_no_violation() -> None:
    assert (
        evidence.violations(seen(exit_code=1, resources=CGROUP, report=report("MemoryError"))) == []
    )


def test_memory_error_under_rlimit_as_without_a_cgroup_is_the_guests_word() -> None:
    v = only(evidence.violations(seen(exit_code=1, report=report("MemoryError"), script="x = 1")))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "memory", None, "refused", Evidence.GUEST
    )  # fmt: skip


def test_a_script_raising_memory_error_itself_is_no_violation() -> None:
    observed = seen(exit_code=1, report=report("MemoryError"), script="raise MemoryError")
    assert evidence.violations(observed) == []


# -- processes ---------------------------------------------------------------------------------
def test_processes_pids_events_are_the_kernels_with_pids_peak() -> None:
    used = replace(CGROUP, pids_limit_hits=7, peak_pids=64)
    v = only(evidence.violations(seen(exit_code=0, resources=used)))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "processes", 64, "refused", Evidence.KERNEL
    )  # fmt: skip
    assert "refused 7 process" in v.detail


def test_processes_a_pids_flag_without_a_count_says_some() -> None:
    v = only(evidence.violations(seen(resources=replace(CGROUP, pids_limit_hit=True))))
    assert (v.limit, v.observed, v.evidence) == ("processes", None, Evidence.KERNEL)
    assert "refused some process" in v.detail


THREAD = report("RuntimeError", "can't start new thread")
FORK = report("BlockingIOError", "Resource temporarily unavailable", errno="EAGAIN",
              refused_by="RLIMIT_NPROC")  # fmt: skip


@pytest.mark.parametrize(("claim", "what"), [(THREAD, "thread"), (FORK, "process")],
                         ids=["thread", "fork-gvisor"])  # fmt: skip
def test_processes_a_refused_start_where_no_pids_cgroup_counts_is_the_guests(
    claim: dict[str, Any], what: str
) -> None:
    v = only(evidence.violations(seen(exit_code=1, report=claim, pids_counted=False)))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "processes", None, "refused", Evidence.GUEST
    )  # fmt: skip
    assert v.detail == f"the script reported a {what} start refused at the limit"


@pytest.mark.parametrize("claim", [THREAD, FORK], ids=["thread", "fork"])
def test_processes_a_reported_start_where_the_pids_cgroup_counts_proves_nothing(
    claim: dict[str, Any],
) -> None:
    assert evidence.violations(seen(exit_code=1, report=claim, resources=CGROUP)) == []


@pytest.mark.parametrize(
    "claim",
    [
        report("BlockingIOError", errno="EAGAIN"),  # non-blocking I/O's identical EAGAIN
        report("BlockingIOError", errno="EAGAIN", refused_by="something else"),
        report("RuntimeError", "can't start new threads"),
    ],
    ids=["nonblocking-io", "other-refuser", "other-message"],
)
def test_processes_eagain_not_out_of_a_process_start_is_no_violation(
    claim: dict[str, Any],
) -> None:
    assert evidence.violations(seen(exit_code=1, report=claim, pids_counted=False)) == []


def test_processes_a_refusal_the_script_raised_itself_is_no_violation() -> None:
    script = "import errno\nraise BlockingIOError(errno.EAGAIN, 'x')\n"
    claim = {**FORK, "line": 2}
    assert evidence.violations(seen(report=claim, pids_counted=False, script=script)) == []


# -- file_size ---------------------------------------------------------------------------------
def test_file_size_sigxfsz_with_a_full_tmpfs_is_the_kernels() -> None:
    used = replace(CGROUP, tmpfs=(ROOMY_TMP, FULL_TMP))
    v = only(evidence.violations(seen(exit_code=-signal.SIGXFSZ, resources=used)))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "file_size", LIMITS.file_size_bytes, "killed", Evidence.KERNEL
    )  # fmt: skip


def test_file_size_sigxfsz_without_a_full_tmpfs_is_the_scripts_own_signal() -> None:
    used = replace(CGROUP, tmpfs=(ROOMY_TMP,))
    assert evidence.violations(seen(exit_code=-signal.SIGXFSZ, resources=used)) == []


def test_file_size_sigxfsz_unmeasured_is_trusted_only_where_the_kernel_spares_own_signals() -> None:
    v = only(evidence.violations(seen(exit_code=128 + signal.SIGXFSZ)))
    assert (v.limit, v.observed, v.evidence) == ("file_size", None, Evidence.KERNEL)
    gvisor = seen(exit_code=128 + signal.SIGXFSZ, own_signals_delivered=True)
    assert evidence.violations(gvisor) == []


@pytest.mark.parametrize("errno_name", ["EFBIG", "ENOSPC"])
def test_file_size_reported_with_a_full_tmpfs_is_the_hosts(errno_name: str) -> None:
    used = replace(CGROUP, tmpfs=(FULL_TMP,))
    claim = report("OSError", errno=errno_name)
    v = only(evidence.violations(seen(exit_code=1, resources=used, report=claim)))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "file_size", LIMITS.file_size_bytes, "refused", Evidence.HOST
    )  # fmt: skip
    assert "/tmp was full" in v.detail


def test_file_size_reported_with_room_left_is_no_violation() -> None:
    used = replace(CGROUP, tmpfs=(ROOMY_TMP,))
    assert evidence.violations(seen(resources=used, report=report("OSError", errno="EFBIG"))) == []


def test_file_size_reported_where_the_host_cannot_measure_is_the_guests() -> None:
    v = only(evidence.violations(seen(report=report("OSError", errno="ENOSPC"))))
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "file_size", None, "refused", Evidence.GUEST
    )  # fmt: skip
    raised = seen(report=report("OSError", errno="EFBIG"), script="raise OSError(27, 'x')")
    assert evidence.violations(raised) == []


# -- open_files --------------------------------------------------------------------------------
EMFILE = report("OSError", "Too many open files", errno="EMFILE")


def test_open_files_is_only_ever_the_guests_word() -> None:
    v = only(evidence.violations(seen(exit_code=1, report=EMFILE, resources=CGROUP)))
    assert (v.limit, v.limit_value, v.observed, v.action, v.evidence) == (
        "open_files", LIMITS.open_files, None, "refused", Evidence.GUEST
    )  # fmt: skip


# -- the guest's word: each at the execution's own value of its limit, in the limit's unit ---
OWN = replace(DEFAULTS, memory_bytes=96 * MiB, processes=12, file_size_bytes=3 * MiB,
              open_files=40)  # fmt: skip
GUEST_CLAIMS = {
    "memory-error": ({"exit_code": 1, "report": report("MemoryError")}, "memory", 96 * MiB,
                     "bytes"),
    "thread-under-rlimit-as": ({"exit_code": 1, "report": {**THREAD, "refused_by": "RLIMIT_AS"}},
                               "memory", 96 * MiB, "bytes"),
    "thread-uncounted": ({"exit_code": 1, "report": THREAD, "pids_counted": False}, "processes",
                         12, "count"),
    "enospc": ({"report": report("OSError", errno="ENOSPC")}, "file_size", 3 * MiB, "bytes"),
    "emfile": ({"exit_code": 1, "report": EMFILE}, "open_files", 40, "count"),
}  # fmt: skip


@pytest.mark.parametrize(("fields", "limit", "value", "unit"), GUEST_CLAIMS.values(),
                         ids=GUEST_CLAIMS)  # fmt: skip
def test_a_guest_violation_carries_its_limits_value_and_unit(
    fields: dict[str, Any], limit: str, value: int, unit: str
) -> None:
    v = only(evidence.violations(Observations(limits=OWN, **fields)))
    assert (v.limit, v.limit_value, type(v.limit_value), v.unit, v.evidence) == (
        limit, value, int, unit, Evidence.GUEST
    )  # fmt: skip


def test_open_files_the_scripts_own_raise_is_no_violation() -> None:
    script = "x = 1\nraise OSError(\n    24, 'Too many open files'\n)\n"
    for line in (2, 3, 4):  # any line of the raise statement
        assert evidence.violations(seen(report={**EMFILE, "line": line}, script=script)) == []


@pytest.mark.parametrize(
    "script",
    [
        "exec(\"raise OSError(24, 'Too many open files')\")",
        "def g():\n    yield\nit = g()\nnext(it)\nit.throw(OSError(24, 'Too many open files'))",
    ],
    ids=["exec", "generator-throw"],
)
def test_open_files_an_emfile_raised_out_of_sight_is_the_guests_word(script: str) -> None:
    # The report's line is no `raise` statement of the script: the host cannot tell it from a
    # real refusal, so it stands, as the guest's word (SECURITY.md).
    line = script.count("\n") + 1
    v = only(evidence.violations(seen(report={**EMFILE, "line": line}, script=script)))
    assert (v.limit, v.evidence) == ("open_files", Evidence.GUEST)


# -- forged reports ----------------------------------------------------------------------------
def test_a_forged_end_frame_contradicting_the_exit_is_not_the_report() -> None:
    assert evidence.report_agrees(0, 0)
    assert evidence.report_agrees(137, -9)  # the guest's 128 + signal, the host's -signal
    assert not evidence.report_agrees(0, 1)  # `end` with exit 0 sent, then exit(1)
    assert not evidence.report_agrees(1, 0)


def test_a_forged_end_frame_claiming_emfile_is_the_guests_word() -> None:
    v = only(evidence.violations(seen(exit_code=0, report={**EMFILE, "line": 0})))
    assert (v.limit, v.evidence) == ("open_files", Evidence.GUEST)


@pytest.mark.parametrize(
    "claim",
    [report("MemoryError"), EMFILE, report("OSError", errno="EFBIG"), THREAD],
    ids=["memory", "emfile", "efbig", "thread"],
)
def test_a_script_raise_is_never_evidence(claim: dict[str, Any]) -> None:
    observed = seen(exit_code=1, report=claim, pids_counted=False, script="raise x")
    assert evidence.violations(observed) == []
    assert evidence.script_raised("raise x", claim)
    assert not evidence.script_raised("raise x", {**claim, "line": True})


def test_a_report_of_nothing_refused_is_no_violation() -> None:
    assert evidence.violations(seen(exit_code=1, report=report("ValueError", "bad"))) == []
    assert evidence.violations(seen(exit_code=1, report={})) == []


# -- stdout_bytes, stderr_bytes ----------------------------------------------------------------
def test_output_caps_report_the_bytes_written() -> None:
    captures = (Capture("stdout", 100, 150, 50), Capture("stderr", 100, 80, 0))
    v = only(evidence.violations(seen(captures=captures)))
    assert (v.limit, v.limit_value, v.observed, v.action, v.evidence, v.detail) == (
        "stdout_bytes", 100, 150, "truncated", Evidence.HOST, "50 bytes dropped"
    )  # fmt: skip


# -- max_tool_calls, call_log_bytes ------------------------------------------------------------
def test_max_tool_calls_counts_the_calls_attempted() -> None:
    assert evidence.tool_budget_violation(10, 0) is None
    v = evidence.tool_budget_violation(10, 3)
    assert v is not None
    assert (v.limit, v.limit_value, v.observed, v.action, v.evidence) == (
        "max_tool_calls", 10, 13, "refused", Evidence.HOST
    )  # fmt: skip


def test_call_log_bytes_refused_or_truncated_by_the_brokers_count() -> None:
    assert evidence.call_log_violation(100, 90, 90, 0, 0, 0) is None
    refused = evidence.call_log_violation(100, 500, 100, 2, 1, 0)
    cut = evidence.call_log_violation(100, 300, 100, 0, 0, 4)
    assert refused is not None and cut is not None
    assert (refused.observed, refused.action, refused.evidence) == (500, "refused", Evidence.HOST)
    assert (cut.observed, cut.action, cut.evidence) == (300, "truncated", Evidence.HOST)


# -- output_files, output_file_bytes, output_bytes ---------------------------------------------
def test_outputs_the_guests_sizes_of_files_never_received_are_its_word() -> None:
    outputs = OutputCollector(LIMITS)
    outputs.receive(GuestOmit("big.bin", "output_file_bytes", 5 * MiB, LIMITS.output_file_bytes))
    outputs.finish()
    v = only(outputs.violations())
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "output_file_bytes", 5 * MiB, "truncated", Evidence.GUEST
    )  # fmt: skip


def test_outputs_a_frame_the_host_refused_is_the_hosts() -> None:
    outputs = OutputCollector(replace(LIMITS, output_files=1))
    outputs.receive(GuestOutput("a.txt", 1, 0, b"a"))
    outputs.receive(GuestOutput("b.txt", 1, 0, b"b"))
    outputs.finish()
    v = only(outputs.violations())
    assert (v.limit, v.observed, v.action, v.evidence) == (
        "output_files", 2, "truncated", Evidence.HOST
    )  # fmt: skip


# -- expected_calls ----------------------------------------------------------------------------
def test_expected_calls_are_checked_against_the_brokers_log_after_the_end() -> None:
    calls = [
        CallRecord(0, "fetch", {}, CallStatus.OK),
        CallRecord(1, "fetch", {}, CallStatus.REFUSED),  # refused: not done
    ]
    v = only(check_expected_calls([ExpectedCalls("fetch", min=2)], calls))
    assert (v.limit, v.limit_value, v.observed, v.action, v.evidence) == (
        "expected_calls", 2, 1, "reported", Evidence.HOST
    )  # fmt: skip


# -- protocol ----------------------------------------------------------------------------------
def test_protocol_a_rejected_frame_is_the_hosts() -> None:
    killed = seen(killed_for="protocol", protocol_error="frame too large", exit_code=-9)
    v = only(evidence.violations(killed))
    assert (v.limit, v.observed, v.action, v.evidence, v.detail) == (
        "protocol", None, "killed", Evidence.HOST, "frame too large"
    )  # fmt: skip


# -- a session's cells -------------------------------------------------------------------------
def test_a_cell_counts_only_its_own_share_of_the_session_cgroup() -> None:
    before = replace(CGROUP, cpu_time_s=1.0, memory_limit_hits=2, pids_limit_hits=3)
    after = replace(CGROUP, cpu_time_s=1.5, memory_limit_hits=2, pids_limit_hits=3, peak_pids=9)
    share = evidence.cell_share(before, after)
    assert (share.cpu_time_s, share.memory_limit_hits, share.pids_limit_hits) == (0.5, 0, 0)
    assert (share.pids_limit_hit, share.peak_pids) == (False, 9)
    assert evidence.violations(seen(resources=share)) == []


def test_a_cell_interrupted_in_time_keeps_the_session() -> None:
    found = evidence.violations(seen(killed_for="wall_time", wall_time_s=1.0))
    (v,) = evidence.interrupted(found, "wall_time")
    assert (v.limit, v.action) == ("wall_time", "interrupted")
    budget = evidence.session_cpu_violation(60.0, 60.0123)
    assert (budget.limit, budget.limit_value, budget.observed, budget.evidence) == (
        "cpu_time", 60.0, 60.012, Evidence.KERNEL
    )  # fmt: skip
