"""The evidence policy: every rule that turns what was observed of one execution into violations.

A violation is evidence, never a claim. Its ``evidence`` says who observed it: ``kernel`` (a
kernel counter or event: the cgroup's OOM kills, memory failcnt, pids.events and CPU usage, or
the exit status the kernel gave, such as SIGXFSZ), ``host`` (the host's own measurement: its
clock, the output capture's byte counts, the broker's call counts, the sandbox's ``/tmp`` and
``/dev/shm`` usage read with ``fstatvfs``, a frame it rejected) or ``guest`` (only the sandbox's
own report of a refusal, which the host had no way to check). ``observed`` is that measurement,
or None when there is none; it is never the limit copied.

==============  ===================================================  =========================
limit           what shows it, and ``observed``                      evidence
==============  ===================================================  =========================
wall_time       the host's deadline; the host's clock                host
cpu_time        cgroup CPU usage (watchdog) or SIGXCPU with the      kernel (host: the
                usage past the limit; the usage (None unread); the   host's sum, no cgroup)
                host's sum over the sandbox's processes
memory          OOM kill, or a reported MemoryError while failcnt    kernel (host: the
                rose; the cgroup's peak (None for guest); the        host's sum; guest
                host's highest sum of the sandbox's processes; a     with no memory
                thread start the guest saw refused for want of       cgroup)
                address space under RLIMIT_AS
processes       pids.events max; pids.peak where the kernel has it   kernel (guest where only
                (None for guest): a refused thread start (not one    RLIMIT_NPROC counts:
                RLIMIT_AS refused), or an EAGAIN out of an           degraded process
                announced process start under the job's              backend, gVisor)
                RLIMIT_NPROC
file_size       SIGXFSZ (with a full tmpfs where the kernel delivers kernel, host (guest where
                a script its own signals), or a full /tmp or         the host cannot measure)
                /dev/shm with a reported EFBIG/ENOSPC; the fullest
                mount's used bytes
open_files      only the guest's report of EMFILE (no kernel         guest
                counter; its descriptors are closed by then); None
stdout/stderr   the capture's byte counts                            host
max_tool_calls  the broker's count of calls attempted                host
call_log_bytes  the broker's own count of the log's bytes            host
output_*        the guest's sizes of files the host never received   guest (host for frames
                                                                     the host refused)
expected_calls  the broker's call log, after the end                 host
protocol        a frame the host rejected; None                      host
==============  ===================================================  =========================

A memory kill's ``observed`` is the cgroup's own peak, as the kernel counted it: the limit under
the process backend and runc; under gVisor the host's cgroup also charges gVisor's sentry, and
the peak can read a few pages over the limit. It is reported as counted, never trimmed to the
limit (the tests' bound: `tests/memory_peaks.py`).

What a script raises, prints or sends about itself is output, not evidence: a guest report
whose line is the script's own ``raise`` statement never counts (`script_raised`), and an `end`
frame whose exit code contradicts how the sandbox really ended was forged (`report_agrees`).
Any other guest report is a ``guest`` violation, the script's word: a forged frame claiming
EMFILE, or an EMFILE raised through ``exec`` or thrown into a generator, cannot be told from a
real refusal (SECURITY.md).

Every function here is pure: it reads plain values (`Observations`, counts) and returns
violations; the drive loop (`sandbox.execution.drive`), the broker and the output collector
gather the values.
"""

from __future__ import annotations

import ast
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sandbox.backends.base import ResourceUsage
from sandbox.limits import SPEC_BY_NAME, ResolvedLimits
from sandbox.result import Evidence, Violation

__all__ = [
    "Capture",
    "Observations",
    "call_log_violation",
    "cell_share",
    "claimed_violation",
    "interrupted",
    "report_agrees",
    "script_raised",
    "session_cpu_violation",
    "tool_budget_violation",
    "violations",
]


@dataclass(frozen=True)
class Capture:
    """One output stream as the host's capture counted it."""

    name: str  # stdout, stderr
    limit_bytes: int
    total_bytes: int  # what the script wrote
    dropped_bytes: int  # what the cap dropped


@dataclass(frozen=True)
class Observations:
    """What the host saw of one execution, as plain values."""

    limits: ResolvedLimits
    exit_code: int = 0  # the kernel's: negative for a signal, or 128 + the signal
    wall_time_s: float = 0.0  # the host's clock
    killed_for: str | None = None  # why the host stopped it: wall_time, cpu_time, protocol, ...
    protocol_error: str | None = None  # the frame the host rejected
    # The cgroup's counters and the tmpfs usage.
    resources: ResourceUsage = field(default_factory=ResourceUsage)
    captures: tuple[Capture, ...] = ()
    report: Mapping[str, Any] | None = None  # the guest's `end` frame's error, its word
    script: str = ""  # to tell the script's own `raise` from a refusal
    # What the backend can observe: whether a pids cgroup counts the script's processes and
    # threads, and whether the script's kernel delivers the signals it sends itself (gVisor's
    # does, even to its pid namespace's init).
    pids_counted: bool = True
    own_signals_delivered: bool = False


def violations(seen: Observations) -> list[Violation]:
    """Every violation the host and the kernel stand by, then the guest's report weighed."""
    out = [*_killed_by_host(seen), *_resource_violations(seen)]
    if _fsize_signal(seen):
        out.append(_file_size_signal(seen))
    else:
        claimed = claimed_violation(seen)
        if claimed is not None:
            out.append(claimed)
    out.extend(capture_violations(seen.captures))
    return out


def _killed_by_host(seen: Observations) -> list[Violation]:
    out: list[Violation] = []
    if seen.killed_for == "protocol":
        out.append(
            Violation(
                "protocol",
                0,
                None,
                "count",
                "killed",
                seen.protocol_error or "",
                evidence=Evidence.HOST,
            )
        )
    if seen.killed_for == "wall_time":
        out.append(
            Violation(
                "wall_time",
                seen.limits.wall_time_ms / 1000,
                round(seen.wall_time_s, 3),
                "s",
                "killed",
                evidence=Evidence.HOST,
            )
        )
    return out


def _resource_violations(seen: Observations) -> list[Violation]:
    """Memory, CPU time and processes: the kernel's counters and the host's sums."""
    return [*_memory_violations(seen), *_cpu_violations(seen), *_process_violations(seen)]


def _memory_violations(seen: Observations) -> list[Violation]:
    """The sandbox's own OOM kill, the enclosing cgroup's, and the host's sum past the limit."""
    limits, used = seen.limits, seen.resources
    out: list[Violation] = []
    if used.oom_killed:
        out.append(
            Violation(
                "memory",
                limits.memory_bytes,
                used.peak_memory_bytes if used.accounted else None,
                "bytes",
                "killed",
                "the sandbox ran out of memory and was killed",
                evidence=Evidence.KERNEL,
            )
        )
    enclosing = _enclosing_oom_violation(seen)
    if enclosing is not None:
        out.append(enclosing)
    if seen.killed_for == "memory" and used.host_accounted:
        out.append(
            Violation(
                "memory",
                limits.memory_bytes,
                used.peak_memory_bytes,
                "bytes",
                "killed",
                "the host's sum of the resident memory of the sandbox's processes passed the"
                " limit and the sandbox was killed",
                evidence=Evidence.HOST,
            )
        )
    return out


def _enclosing_oom_violation(seen: Observations) -> Violation | None:
    """The kernel's OOM kill in the cgroup enclosing the server (no memory cgroup of the
    sandbox's own): of the sandbox's pid 1 (its SIGKILL death), else of processes the host saw
    end as the kill was counted (`sandbox.backends.process.oom_victims`)."""
    limits, used = seen.limits, seen.resources
    observed = used.peak_memory_bytes if used.host_accounted else None
    where = "the cgroup enclosing the server (the pod or container) ran out of memory"
    if _enclosing_oom_kill(seen):
        detail = (
            f"the kernel's OOM killer killed the sandbox: {where} ({used.enclosing_oom_kills}"
            " OOM kills there while the sandbox lived)"
        )
    elif used.enclosing_oom_victims:
        detail = (
            f"the kernel's OOM killer killed {used.enclosing_oom_victims} of the sandbox's"
            f" processes other than its first: {where} ({used.enclosing_oom_kills} OOM kills"
            " there while the sandbox lived; the host saw the process end in the sampling"
            " period of the kill)"
        )
    else:
        return None
    return Violation(
        "memory", limits.memory_bytes, observed, "bytes", "killed", detail, evidence=Evidence.KERNEL
    )


def _cpu_violations(seen: Observations) -> list[Violation]:
    """CPU time: the host's sum past the limit, or the kernel's signal."""
    limits, used = seen.limits, seen.resources
    out: list[Violation] = []
    if seen.killed_for == "cpu_time" and used.host_accounted:
        out.append(
            Violation(
                "cpu_time",
                limits.cpu_time_ms / 1000,
                round(used.cpu_time_s, 3),
                "s",
                "killed",
                "the host's sum of the CPU time of the sandbox's processes passed the limit",
                evidence=Evidence.HOST,
            )
        )
    elif seen.killed_for == "cpu_time" or _cpu_signal(seen):
        out.append(
            Violation(
                "cpu_time",
                limits.cpu_time_ms / 1000,
                round(used.cpu_time_s, 3) if used.accounted or used.host_accounted else None,
                "s",
                "killed",
                evidence=Evidence.KERNEL,
            )
        )
    return out


def _process_violations(seen: Observations) -> list[Violation]:
    """Processes: the creations the kernel refused at the limit."""
    limits, used = seen.limits, seen.resources
    out: list[Violation] = []
    if used.pids_limit_hit or used.pids_limit_hits:
        refused = used.pids_limit_hits
        out.append(
            Violation(
                "processes",
                limits.processes,
                used.peak_pids,
                "count",
                "refused",
                f"the kernel refused {refused or 'some'} process or thread creations at the limit",
                evidence=Evidence.KERNEL,
            )
        )
    return out


def _signalled(exit_code: int, signum: int) -> bool:
    return exit_code in (-signum, 128 + signum)


def _enclosing_oom_kill(seen: Observations) -> bool:
    """The sandbox died of a SIGKILL the host did not send while the cgroup enclosing the server
    counted OOM kills (no memory cgroup of its own). Nothing inside can SIGKILL a pid namespace's
    init, and the host names every kill it makes (``killed_for``): the kernel's OOM killer did.
    A kill of one of the sandbox's other processes, which the script survives, is told by time
    instead (``enclosing_oom_victims``, `sandbox.backends.process.oom_victims`)."""
    used = seen.resources
    return (
        used.enclosing_oom_kills > 0
        and not used.oom_killed
        and seen.killed_for is None
        and _signalled(seen.exit_code, signal.SIGKILL)
    )


def _cpu_signal(seen: Observations) -> bool:
    """SIGXCPU as the kernel's word: a script can send it to itself, but RLIMIT_CPU is looser
    than the whole-sandbox budget, so a real one comes with the cgroup's usage past the limit."""
    used = seen.resources
    return _signalled(seen.exit_code, signal.SIGXCPU) and (
        not used.accounted or used.cpu_time_s * 1000 >= seen.limits.cpu_time_ms
    )


def _fsize_signal(seen: Observations) -> bool:
    """SIGXFSZ as the kernel's word: a real one comes with a full tmpfs (it is as large as the
    file size limit); where the tmpfs cannot be measured, only where the kernel spares the
    script its own signals."""
    if not _signalled(seen.exit_code, signal.SIGXFSZ):
        return False
    tmpfs = seen.resources.tmpfs
    return any(t.full for t in tmpfs) if tmpfs else not seen.own_signals_delivered


def _file_size_signal(seen: Observations) -> Violation:
    fullest = max(seen.resources.tmpfs, key=lambda t: t.used_bytes, default=None)
    return Violation(
        "file_size",
        seen.limits.file_size_bytes,
        fullest.used_bytes if fullest else None,
        "bytes",
        "killed",
        "a write past the file size limit was killed by SIGXFSZ",
        evidence=Evidence.KERNEL,
    )


def capture_violations(captures: Sequence[Capture]) -> list[Violation]:
    """The output caps that dropped bytes, with the host's count of what was written."""
    return [
        Violation(
            f"{c.name}_bytes",
            c.limit_bytes,
            c.total_bytes,
            "bytes",
            "truncated",
            f"{c.dropped_bytes} bytes dropped",
            evidence=Evidence.HOST,
        )
        for c in captures
        if c.dropped_bytes
    ]


# -- the guest's report ------------------------------------------------------------------------
def claimed_violation(seen: Observations) -> Violation | None:
    """The violation behind the guest's report of a refusal, if the host can stand by it.

    The report (`end` frame) is the script's to forge: it names a refusal only the guest saw
    (MemoryError, EMFILE, EFBIG, ENOSPC, a refused thread or process start). Where the host has
    a counter for that limit, the counter decides and the report alone proves nothing; where it
    has none, the violation says ``guest``, unless the line the report names is the script's
    own ``raise`` statement.
    """
    report = seen.report
    if not report:
        return None
    kind, errno_name = str(report.get("type", "")), report.get("errno")
    if kind == "MemoryError":
        return _claimed_memory(seen, report)
    if errno_name in ("EFBIG", "ENOSPC"):
        return _claimed_file_size(seen, report, str(errno_name))
    what = _refused_start(report)
    if what == "thread" and report.get("refused_by") == "RLIMIT_AS":
        if seen.resources.accounted:
            return None  # a memory cgroup counts the sandbox: its own figures decide
        # The address-space rlimit had no room left for one more thread's stack: memory, not
        # the process count (the guest probed the address space right after the refusal).
        return _guest(
            seen,
            report,
            "memory",
            "the script reported a thread start refused: its stack no longer fit under the"
            " address-space rlimit (RLIMIT_AS)",
        )
    if what is not None and not seen.pids_counted:
        # RLIMIT_NPROC (no pids cgroup here, or gVisor's kernel counting the script's tasks)
        # refused it: no host counter saw it.
        return _guest(
            seen,
            report,
            "processes",
            f"the script reported a {what} start refused at the limit",
        )
    if errno_name == "EMFILE":
        # RLIMIT_NOFILE has no kernel counter, and the descriptors are closed as the error
        # unwinds, before the report: only the guest ever sees this refusal.
        return _guest(
            seen,
            report,
            "open_files",
            "the script reported an open that failed with EMFILE",
        )
    return None


def _claimed_memory(seen: Observations, report: Mapping[str, Any]) -> Violation | None:
    used = seen.resources
    if used.oom_killed:
        return None  # reported from the kernel's own event
    if used.accounted:
        if not used.memory_limit_hits:
            return None
        return Violation(
            "memory",
            seen.limits.memory_bytes,
            used.peak_memory_bytes,
            "bytes",
            "refused",
            "an allocation was refused; the memory cgroup reached its limit "
            f"{used.memory_limit_hits} times",
            evidence=Evidence.KERNEL,
        )
    return _guest(
        seen,
        report,
        "memory",
        "the script reported a MemoryError under the address-space rlimit",
    )


def _claimed_file_size(
    seen: Observations, report: Mapping[str, Any], errno_name: str
) -> Violation | None:
    tmpfs = seen.resources.tmpfs
    if not tmpfs:
        return _guest(
            seen,
            report,
            "file_size",
            f"the script reported a write that failed with {errno_name}",
        )
    full = [t for t in tmpfs if t.full]
    if not full:
        return None
    where = full[0]
    return Violation(
        "file_size",
        seen.limits.file_size_bytes,
        where.used_bytes,
        "bytes",
        "refused",
        f"a write failed with {errno_name}; the sandbox's {where.mount} was full"
        f" ({where.used_bytes} of {where.size_bytes} bytes)",
        evidence=Evidence.HOST,
    )


def _refused_start(report: Mapping[str, Any]) -> str | None:
    """``thread`` or ``process`` when the report is a start RLIMIT_NPROC refused.

    A refused fork raises BlockingIOError (EAGAIN), which non-blocking I/O raises too: only one
    the guest saw come out of a process start under the job's RLIMIT_NPROC (``refused_by``, see
    the bootstrap's ``_process_start_refused``) is claimed."""
    kind = report.get("type")
    if kind == "RuntimeError" and report.get("message") == "can't start new thread":
        return "thread"
    if (
        kind == "BlockingIOError"
        and report.get("errno") == "EAGAIN"
        and report.get("refused_by") == "RLIMIT_NPROC"
    ):
        return "process"
    return None


def _guest(
    seen: Observations, report: Mapping[str, Any], limit: str, detail: str
) -> Violation | None:
    """A refusal only the guest saw, unless the script raised it itself: at ``limit``'s value,
    in its unit (a size or a count: no time limit is the guest's word alone)."""
    if script_raised(seen.script, report):
        return None
    spec = SPEC_BY_NAME[limit]
    return Violation(
        limit, seen.limits.value(limit), None, spec.unit, "refused", detail, evidence=Evidence.GUEST
    )


def script_raised(script: str, report: Mapping[str, Any]) -> bool:
    """Whether the report's line is a ``raise`` statement of the script: the script made the
    error up itself, no kernel refused anything."""
    line = report.get("line")
    if not isinstance(line, int) or isinstance(line, bool) or line <= 0:
        return False
    return line in _raise_lines(script)


def _raise_lines(script: str) -> set[int]:
    """The lines of every ``raise`` statement in the script."""
    try:
        tree = ast.parse(script)
    except (SyntaxError, ValueError):
        return set()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def report_agrees(reported: int, observed: int) -> bool:
    """Whether the guest's exit code matches the host's (which reads codes over 128 as
    signals): one that contradicts how the sandbox really ended was forged by the script (an
    `end` frame sent over the channel, then another exit)."""
    return observed == reported or (reported > 128 and observed == 128 - reported)


# -- the broker's counts -----------------------------------------------------------------------
def tool_budget_violation(max_tool_calls: int, refused_over_budget: int) -> Violation | None:
    """The calls past the tool-call budget, which the broker refused."""
    if not refused_over_budget:
        return None
    return Violation(
        "max_tool_calls",
        float(max_tool_calls),
        float(max_tool_calls + refused_over_budget),
        "count",
        "refused",
        f"{refused_over_budget} calls over the budget were refused",
        evidence=Evidence.HOST,
    )


def call_log_violation(
    limit_bytes: int,
    wanted_bytes: int,
    used_bytes: int,
    refused_calls: int,
    unrecorded: int,
    cut_values: int,
) -> Violation | None:
    """The call log's cap: ``refused`` when a call's arguments did not fit, else
    ``truncated`` (results or errors kept as a marker); observed is what the log would have
    held with nothing cut."""
    if not (refused_calls or cut_values):
        return None
    return Violation(
        "call_log_bytes",
        float(limit_bytes),
        float(wanted_bytes),
        "bytes",
        "refused" if refused_calls else "truncated",
        f"the call log kept {used_bytes} of {wanted_bytes} bytes: {refused_calls} calls "
        f"refused (no room for their arguments; {unrecorded} of them not recorded), "
        f"{cut_values} results or errors kept as a marker",
        evidence=Evidence.HOST,
    )


# -- a session's cells -------------------------------------------------------------------------
def cell_share(before: ResourceUsage, after: ResourceUsage) -> ResourceUsage:
    """The cell's own part of the session cgroup's counters, which count from the sandbox's
    start: a refusal an earlier cell met is not this cell's violation. Peaks and the OOM
    event stay the sandbox's (memory and processes are limits of the whole session)."""
    pids_hits = max(0, after.pids_limit_hits - before.pids_limit_hits)
    if after.pids_limit_hits or before.pids_limit_hits:
        pids_hit = pids_hits > 0
    else:  # a flag without a count: only its change is this cell's
        pids_hit = after.pids_limit_hit and not before.pids_limit_hit
    return replace(
        after,
        cpu_time_s=max(0.0, after.cpu_time_s - before.cpu_time_s),
        memory_limit_hits=max(0, after.memory_limit_hits - before.memory_limit_hits),
        pids_limit_hits=pids_hits,
        pids_limit_hit=pids_hit,
    )


def session_cpu_violation(total_cpu_s: float, used_cpu_s: float) -> Violation:
    """The session's total CPU budget, spent: the session ends (the cgroup's usage)."""
    return Violation(
        "cpu_time",
        total_cpu_s,
        round(used_cpu_s, 3),
        "s",
        "killed",
        "the session's total CPU budget was spent; the session ended",
        evidence=Evidence.KERNEL,
    )


def interrupted(found: Sequence[Violation], limit: str | None) -> list[Violation]:
    """A cell the interrupt stopped in time: its violation's action is ``interrupted``."""
    return [replace(v, action="interrupted") if v.limit == limit else v for v in found]
