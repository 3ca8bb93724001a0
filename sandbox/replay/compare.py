"""The differences between a recorded execution and its replay.

Compared: status, exit code, the script's error, stdout and stderr (the replay's cut to what the
record keeps, `OUTPUT_CAP_BYTES` per stream, so a long output compares equal when it is),
violations and the call sequence. Measurements are not compared: timings, usage, and a
violation's `observed` and `detail` (a wall-time kill is observed at 1.002 s once and 1.004 s the
next time); a violation compares by its limit, value, unit, action and evidence. A call compares
by tool, arguments, status and its result or error; its place in the sequence is its seq.
"""

from __future__ import annotations

from typing import Any

from sandbox.audit import OUTPUT_CAP_BYTES, result_to_json
from sandbox.replay.dispatch import RecordedCalls, cut_by_call_log
from sandbox.replay.report import Difference
from sandbox.result import CallRecord, CallStatus, ExecutionResult, Violation

__all__ = ["compare"]


def _call(call: CallRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seq": call.seq,
        "tool": call.tool,
        "arguments": call.arguments,
        "status": str(call.status),
    }
    if call.status == CallStatus.OK:
        out["result"] = call.result
    else:
        out["error"] = call.error
    return out


def _outcome(call: CallRecord) -> tuple[str, Any]:
    return str(call.status), call.result if call.status == CallStatus.OK else call.error


def _violation(v: Violation) -> dict[str, Any]:
    return {
        "limit": v.limit,
        "limit_value": v.limit_value,
        "unit": v.unit,
        "action": v.action,
        "evidence": str(v.evidence),
    }


def _first_line_difference(recorded: str, replayed: str) -> str:
    old, new = recorded.splitlines(), replayed.splitlines()
    for number, (a, b) in enumerate(zip(old, new, strict=False), start=1):
        if a != b:
            return f"line {number} was {a[:200]!r}, is {b[:200]!r}"
    if len(old) != len(new):
        return f"{_lines(len(old))} recorded, {_lines(len(new))} replayed"
    return "they differ in line endings"


def _lines(count: int) -> str:
    return f"{count} line" if count == 1 else f"{count} lines"


def compare(
    recorded: ExecutionResult, replayed: ExecutionResult, calls: RecordedCalls
) -> list[Difference]:
    """Every difference, in a fixed order: status, exit code, error, stdout, stderr,
    violations, then the calls (in the replay's order, then the recorded calls it missed)."""
    out: list[Difference] = []
    if recorded.status != replayed.status:
        out.append(
            Difference(
                "status",
                "changed",
                str(recorded.status),
                str(replayed.status),
                f"status was {recorded.status}, is {replayed.status}",
            )
        )
    if recorded.exit_code != replayed.exit_code:
        out.append(
            Difference(
                "exit_code",
                "changed",
                recorded.exit_code,
                replayed.exit_code,
                f"exit code was {recorded.exit_code}, is {replayed.exit_code}",
            )
        )
    old_error = recorded.error.to_json() if recorded.error else None
    new_error = replayed.error.to_json() if replayed.error else None
    if old_error != new_error:
        say = {None: "none"}
        out.append(
            Difference(
                "error",
                "changed",
                old_error,
                new_error,
                "error was "
                + (say[None] if recorded.error is None else _error_text(old_error))
                + ", is "
                + (say[None] if replayed.error is None else _error_text(new_error)),
            )
        )
    kept = result_to_json(replayed, OUTPUT_CAP_BYTES)  # the replay as its record keeps it
    for stream in ("stdout", "stderr"):
        old_text: str = getattr(recorded, stream)
        new_text: str = kept[stream]
        if old_text != new_text:
            out.append(
                Difference(
                    stream,
                    "changed",
                    old_text,
                    new_text,
                    f"{stream} differs: {_first_line_difference(old_text, new_text)}",
                )
            )
    old_violations = [_violation(v) for v in recorded.violations]
    new_violations = [_violation(v) for v in replayed.violations]
    if old_violations != new_violations:
        names = [v["limit"] for v in old_violations] or ["none"]
        new_names = [v["limit"] for v in new_violations] or ["none"]
        out.append(
            Difference(
                "violations",
                "changed",
                old_violations,
                new_violations,
                f"violations were {', '.join(names)}, are {', '.join(new_names)}",
            )
        )
    out += _compare_calls(replayed.calls, calls)
    return out


def _error_text(error: dict[str, Any] | None) -> str:
    assert error is not None
    line = f" (line {error['line']})" if error.get("line") else ""
    return f"{error['type']}: {error['message']}{line}"


def _compare_calls(replayed: list[CallRecord], calls: RecordedCalls) -> list[Difference]:
    out: list[Difference] = []
    for call in replayed:
        what = f"calls[{call.seq}]"
        match = calls.take(call.seq, call.tool, call.arguments)
        if match is None:
            out.append(
                Difference(
                    what,
                    "unmatched",
                    None,
                    _call(call),
                    f"call {call.seq} of {call.tool!r} has no recorded call with the same tool "
                    f"and arguments; it was {call.status}: {call.error or ''}".rstrip(": "),
                )
            )
            continue
        if cut_by_call_log(match):
            out.append(
                Difference(
                    what,
                    "inexact",
                    _call(match),
                    _call(call),
                    f"recorded call {match.seq} of {call.tool!r} kept a marker instead of its "
                    "result or error (call_log_bytes), so it could not be replayed exactly",
                )
            )
        elif _outcome(match) != _outcome(call):
            out.append(
                Difference(
                    what,
                    "changed",
                    _call(match),
                    _call(call),
                    f"call {call.seq} of {call.tool!r} ended {match.status} when recorded, "
                    f"{call.status} now" + (f": {call.error}" if call.error else ""),
                )
            )
        elif match.seq != call.seq:
            out.append(
                Difference(
                    what,
                    "reordered",
                    _call(match),
                    _call(call),
                    f"call {call.seq} of {call.tool!r} was call {match.seq} when recorded",
                )
            )
    for missed in calls.untaken():
        out.append(
            Difference(
                f"calls[{missed.seq}]",
                "missing",
                _call(missed),
                None,
                f"recorded call {missed.seq} of {missed.tool!r} "
                f"({_arguments(missed.arguments)}) was not made by the replay",
            )
        )
    return out


def _arguments(arguments: Any) -> str:
    if arguments == {}:
        return "no arguments"
    if isinstance(arguments, dict):
        text = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    else:
        text = repr(arguments)
    return text if len(text) <= 200 else text[:197] + "..."
