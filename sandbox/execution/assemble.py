"""Result assembly: how a driven execution becomes its `ExecutionResult`.

Status rules, in order: cancelled; rejected (bad syntax or script policy, before any sandbox);
limit_exceeded when any violation was recorded (a limit killed, cut or refused something, or
the call counts missed their expectation); error when the script exited non-zero, or ended
without the bootstrap's report; else ok.

The guest's `end` report is advisory: one that contradicts how the sandbox really ended is
dropped (`sandbox.execution.evidence.report_agrees`), and the script's error is then the
host's account of the ending (killed by a signal, or no report at all).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sandbox.backends.base import Outcome
from sandbox.execution import evidence
from sandbox.execution.broker import Broker
from sandbox.execution.request import PreparedExecution
from sandbox.expectations import ExpectedCalls, check_expected_calls
from sandbox.protocol import GuestEnd
from sandbox.result import ExecutionResult, ExecutionStatus, ScriptError, Usage, Violation

__all__ = [
    "cancelled_before_start",
    "classify_error",
    "finish",
    "rejected",
    "start",
    "status_of",
]


def start(prepared: PreparedExecution, backend: str, session_id: str | None) -> ExecutionResult:
    """The result of ``prepared`` before it runs: what it is and where it runs."""
    result = ExecutionResult(
        execution_id=prepared.execution_id,
        status=ExecutionStatus.OK,
        backend=backend,
        effective_limits=prepared.limits,
        adjustments=list(prepared.adjustments),
        started_at=time.time(),
        input_files=[f.digest() for f in prepared.request.files],
    )
    if session_id is not None:
        result.session_id = session_id
    return result


def rejected(result: ExecutionResult, rejection: ScriptError) -> ExecutionResult:
    """A script refused before any sandbox (syntax or policy)."""
    result.status = ExecutionStatus.REJECTED
    result.error = rejection
    result.exit_code = 1
    result.stderr = f"{rejection.type}: {rejection.message}{rejection.where()}\n"
    result.finished_at = time.time()
    return result


def cancelled_before_start(result: ExecutionResult) -> ExecutionResult:
    """Cancelled while it waited for a sandbox: nothing ran."""
    result.status = ExecutionStatus.CANCELLED
    result.finished_at = time.time()
    return result


def finish(
    result: ExecutionResult,
    outcome: Outcome,
    broker: Broker,
    expected: Sequence[ExpectedCalls],
    *,
    in_session: bool,
) -> ExecutionResult:
    """The result of a driven execution: violations, output, the error and the status."""
    result.calls = broker.calls
    result.violations = [
        *outcome.violations,
        *broker.violations(),
        *check_expected_calls(expected, broker.calls),
    ]
    result.sort_violations()
    result.stdout = outcome.stdout.text()
    result.stderr = outcome.stderr.text()
    result.output_files = list(outcome.outputs)
    result.omitted_outputs = list(outcome.omitted_outputs)
    end = outcome.end
    if end is not None and not evidence.report_agrees(end.exit_code, outcome.exit_code):
        # Forged by the script: an `end` frame sent over the channel, then another exit.
        end = None
    result.exit_code = end.exit_code if end is not None else outcome.exit_code
    if end is not None and in_session:
        result.value = end.value
    result.error = classify_error(end, result.exit_code)
    result.usage = Usage(
        wall_time_s=outcome.wall_time_s,
        cpu_time_s=outcome.resources.cpu_time_s,
        peak_memory_bytes=outcome.resources.peak_memory_bytes,
        stdout_bytes=outcome.stdout.total,
        stderr_bytes=outcome.stderr.total,
        tool_calls=len(broker.calls),
    )
    result.status = status_of(outcome.cancelled, result.violations, result.exit_code, end)
    result.finished_at = time.time()
    return result


def classify_error(end: GuestEnd | None, exit_code: int) -> ScriptError | None:
    """The script's error: the bootstrap's report where it stands, else the host's account."""
    if end is not None:
        if not end.error:
            return None
        return ScriptError(
            str(end.error.get("type", ""))[:200],
            str(end.error.get("message", ""))[:2000],
            _line(end.error.get("line")),
        )
    if exit_code < 0:
        return ScriptError("Killed", f"the sandbox was killed by signal {-exit_code}")
    # The bootstrap reports every ending it sees; no report means the script closed or broke
    # the tool channel, or left through os._exit.
    return ScriptError(
        "NoReport",
        f"the script exited with code {exit_code} without the bootstrap's report (it closed "
        "the tool channel or called os._exit)",
    )


def status_of(
    cancelled: bool, violations: Sequence[Violation], exit_code: int, end: GuestEnd | None
) -> ExecutionStatus:
    """The documented precedence (module docstring); rejection is decided before any run."""
    if cancelled:
        return ExecutionStatus.CANCELLED
    if violations:
        return ExecutionStatus.LIMIT_EXCEEDED
    if exit_code != 0 or end is None:
        return ExecutionStatus.ERROR
    return ExecutionStatus.OK


def _line(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
