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
from sandbox.replay_report import Difference
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
    kept = result_to_json(replayed, OUTPUT_CAP_BYTES)  # the replay as its record keeps it
    found = [
        _status(recorded, replayed),
        _exit_code(recorded, replayed),
        _error(recorded, replayed),
        *(_stream(name, getattr(recorded, name), kept[name]) for name in ("stdout", "stderr")),
        _violations(recorded, replayed),
    ]
    return [d for d in found if d is not None] + _compare_calls(replayed.calls, calls)


def _status(recorded: ExecutionResult, replayed: ExecutionResult) -> Difference | None:
    if recorded.status == replayed.status:
        return None
    old, new = str(recorded.status), str(replayed.status)
    return Difference("status", "changed", old, new, f"status was {old}, is {new}")


def _exit_code(recorded: ExecutionResult, replayed: ExecutionResult) -> Difference | None:
    old, new = recorded.exit_code, replayed.exit_code
    if old == new:
        return None
    return Difference("exit_code", "changed", old, new, f"exit code was {old}, is {new}")


def _error(recorded: ExecutionResult, replayed: ExecutionResult) -> Difference | None:
    old = recorded.error.to_json() if recorded.error else None
    new = replayed.error.to_json() if replayed.error else None
    if old == new:
        return None
    said = f"error was {_error_text(old)}, is {_error_text(new)}"
    return Difference("error", "changed", old, new, said)


def _stream(name: str, old: str, new: str) -> Difference | None:
    if old == new:
        return None
    said = f"{name} differs: {_first_line_difference(old, new)}"
    return Difference(name, "changed", old, new, said)


def _violations(recorded: ExecutionResult, replayed: ExecutionResult) -> Difference | None:
    old = [_violation(v) for v in recorded.violations]
    new = [_violation(v) for v in replayed.violations]
    if old == new:
        return None
    names = ", ".join([v["limit"] for v in old] or ["none"])
    new_names = ", ".join([v["limit"] for v in new] or ["none"])
    said = f"violations were {names}, are {new_names}"
    return Difference("violations", "changed", old, new, said)


def _error_text(error: dict[str, Any] | None) -> str:
    if error is None:
        return "none"
    line = f" (line {error['line']})" if error.get("line") else ""
    return f"{error['type']}: {error['message']}{line}"


def _compare_calls(replayed: list[CallRecord], calls: RecordedCalls) -> list[Difference]:
    """The replay's calls in its order, each against the recorded call with the same tool and
    arguments, then each recorded call the replay did not make."""
    out = [
        difference
        for call in replayed
        if (difference := _call_difference(call, calls.take(call.seq, call.tool, call.arguments)))
        is not None
    ]
    for missed in calls.untaken():
        said = (
            f"recorded call {missed.seq} of {missed.tool!r} "
            f"({_arguments(missed.arguments)}) was not made by the replay"
        )
        out.append(Difference(f"calls[{missed.seq}]", "missing", _call(missed), None, said))
    return out


def _call_difference(call: CallRecord, match: CallRecord | None) -> Difference | None:
    """How a replayed call differs from the recorded call it matched (None: it does not)."""
    what, tool = f"calls[{call.seq}]", repr(call.tool)
    if match is None:
        said = (
            f"call {call.seq} of {tool} has no recorded call with the same tool "
            f"and arguments; it was {call.status}: {call.error or ''}".rstrip(": ")
        )
        return Difference(what, "unmatched", None, _call(call), said)
    if cut_by_call_log(match):
        said = (
            f"recorded call {match.seq} of {tool} kept a marker instead of its "
            "result or error (call_log_bytes), so it could not be replayed exactly"
        )
        return Difference(what, "inexact", _call(match), _call(call), said)
    if _outcome(match) != _outcome(call):
        said = f"call {call.seq} of {tool} ended {match.status} when recorded, {call.status} now"
        said += f": {call.error}" if call.error else ""
        return Difference(what, "changed", _call(match), _call(call), said)
    if match.seq != call.seq:
        said = f"call {call.seq} of {tool} was call {match.seq} when recorded"
        return Difference(what, "reordered", _call(match), _call(call), said)
    return None


def _arguments(arguments: Any) -> str:
    if arguments == {}:
        return "no arguments"
    if isinstance(arguments, dict):
        text = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    else:
        text = repr(arguments)
    return text if len(text) <= 200 else text[:197] + "..."
