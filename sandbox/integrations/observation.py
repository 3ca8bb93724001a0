"""The observation: what the model reads after its script ran, bounded and honest about cuts.

Sections, in order: a status line (status, exit code, call counts by status), the script's
stdout, one line per tool call, the violations, the script's error and the tail of stderr.
Numbers are printed exactly (integers as integers, sizes in bytes with a binary unit beside them),
never in exponent form. A call's line names its outcome right after the tool: arguments are cut
to a third of the line's budget with an explicit marker, so a long argument never pushes the
outcome off the line. The stderr traceback shows the script's own frames with the script's line
numbers (and source, when the script is known); the frames of the sandbox's runtime, the
generated stubs and the standard library are folded into one counted marker, and so are the
frames of a prelude an adapter put before the model's code (`ScriptSource.prelude_lines`); that
folding is `sandbox.integrations.script_frames`'s.
Every section has a budget (`ObservationBudget`); whatever does not fit is replaced by an
explicit marker that says how much was cut (bytes and lines of output, which calls by number),
and the whole text has a hard byte ceiling with a final marker of its own.

Long output keeps its head and its tail: the start says what the script set out to do, the end
usually holds the answer. Calls that failed are shown before ok calls are, because the next step
needs them. A call's result is cut to its tool's `x-ptc.summary_fields` when the tool declares
them — a summary by declaration keeps the fields the next step needs, where truncation by
position would drop them silently — and the line is then cut to `call_chars` with a marker.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.integrations.script_frames import ScriptSource, error_line, script_frames
from sandbox.result import CallRecord, CallStatus, ExecutionResult, Violation

__all__ = ["ObservationBudget", "ScriptSource", "render_observation", "summarize_result"]


@dataclass(frozen=True)
class ObservationBudget:
    """Size bounds of one observation; bytes are UTF-8 bytes."""

    max_bytes: int = 12_000
    stdout_bytes: int = 6_000
    stdout_lines: int = 200
    stderr_bytes: int = 1_000
    calls: int = 30
    call_chars: int = 240


def summarize_result(value: Any, fields: Sequence[str]) -> Any:
    """``value`` reduced to the declared ``fields`` (dotted paths reach into nested objects);
    lists are reduced element by element; anything else is returned unchanged."""
    if not fields:
        return value
    if isinstance(value, list):
        return [summarize_result(item, fields) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for path in fields:
        head, _, rest = path.partition(".")
        if head not in value:
            continue
        if rest:
            inner = summarize_result(value[head], [rest])
            if isinstance(inner, dict) and isinstance(out.get(head), dict):
                out[head].update(inner)
            else:
                out[head] = inner
        else:
            out[head] = value[head]
    return out


def render_observation(
    result: ExecutionResult,
    summary_fields: Mapping[str, Sequence[str]] | None = None,
    budget: ObservationBudget | None = None,
    script: ScriptSource | None = None,
) -> str:
    budget = budget or ObservationBudget()
    fields = summary_fields or {}
    source = script or ScriptSource("")
    stderr = script_frames(result.stderr, source) if result.stderr else ""
    parts = [_status_line(result)]
    if result.stdout:
        parts.append("--- stdout ---\n" + _head_tail(result.stdout, budget, "stdout"))
    if result.value is not None:  # a session's cell: its final bare expression, as a repr
        parts.append("--- value ---\n" + _head_tail(result.value, budget, "value"))
    if result.session_lost:
        parts.append(f"--- session lost ---\n{result.session_lost}")
    if result.calls:
        parts.append(_calls(result.calls, fields, budget))
    if result.violations:
        parts.append("\n".join(["--- violations ---", *map(_violation_line, result.violations)]))
    if result.output_files or result.omitted_outputs:
        parts.append(_outputs(result))
    if result.error is not None:
        error = f"{result.error.type}: {result.error.message}"
        line = error_line(result.stderr, result.error.line, source)
        parts.append(f"--- error ---\n{error}{line}")
    if stderr and result.error is None:
        parts.append("--- stderr ---\n" + _tail(stderr, budget.stderr_bytes, "stderr"))
    elif stderr:
        # The traceback's last lines name the error already shown; keep the tail only.
        parts.append("--- stderr (tail) ---\n" + _tail(stderr, budget.stderr_bytes, "stderr"))
    return _cap("\n".join(parts), budget.max_bytes)


def _outputs(result: ExecutionResult) -> str:
    """The files the script left under outputs/: returned (name, size, sha256) or not (why)."""
    lines = ["--- output files ---"]
    for f in result.output_files:
        lines.append(f"outputs/{f.name}: {_quantity(f.size, 'bytes')}, sha256 {f.sha256}")
    for o in result.omitted_outputs:
        size = "" if o.size is None else f", {_quantity(o.size, 'bytes')}"
        if o.reason == "more":
            lines.append(f"and {o.size} more files not returned")
        else:
            lines.append(f"outputs/{o.name}: not returned ({o.reason}{size})")
    return "\n".join(lines)


def _status_line(result: ExecutionResult) -> str:
    counts = Counter(str(c.status) for c in result.calls)
    by_status = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    calls = _plural(len(result.calls), "tool call") + (f" ({by_status})" if by_status else "")
    return f"status: {result.status} · exit code {result.exit_code} · {calls}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _plain(value: float) -> str:
    """A number as written by hand: no exponent, no trailing zeros, integers without a point."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


_BINARY_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def _quantity(value: float | None, unit: str) -> str:
    if value is None:
        return "not measured"
    if unit == "bytes":
        text = f"{_plain(value)} bytes"
        for name, size in _BINARY_UNITS:
            if value >= size:
                scaled = value / size
                shown = _plain(scaled) if scaled.is_integer() else f"{scaled:.1f}"
                return f"{text} ({shown} {name})"
        return text
    if unit in ("count", ""):
        return _plain(value)
    return f"{_plain(value)} {unit}"


def _violation_line(v: Violation) -> str:
    observed: float | None = v.observed
    limit = _quantity(v.limit_value, v.unit)
    seen = _quantity(observed, v.unit)
    if v.limit == "expected_calls":
        # A check of the finished script's call log, not a resource the sandbox stopped.
        what = f"expected_calls: {v.detail}" if v.detail else "expected_calls: not met"
        return f"{what} (checked after the script ended)"
    detail = f": {v.detail}" if v.detail else ""
    if str(getattr(v, "evidence", "")) == "guest":
        detail += " (reported from inside the sandbox; the host could not confirm it)"
    return f"{v.limit}: limit {limit}, observed {seen}, action {v.action}{detail}"


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _clip(text: str, limit: int, *, from_end: bool = False) -> str:
    """At most ``limit`` UTF-8 bytes of ``text``, cut on a character boundary."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    piece = data[len(data) - limit :] if from_end else data[:limit]
    return piece.decode("utf-8", "ignore")


def _head_tail(text: str, budget: ObservationBudget, name: str) -> str:
    lines = text.splitlines(keepends=True)
    if _size(text) <= budget.stdout_bytes and len(lines) <= budget.stdout_lines:
        return text.rstrip("\n")
    half_bytes, half_lines = budget.stdout_bytes // 2, max(budget.stdout_lines // 2, 1)
    head: list[str] = []
    used = 0
    for line in lines[:half_lines]:
        if used + _size(line) > half_bytes:
            if not head:  # one huge line: keep its start
                head.append(_clip(line, half_bytes))
            break
        head.append(line)
        used += _size(line)
    tail: list[str] = []
    used = 0
    for line in reversed(lines[len(head) :][-half_lines:]):
        if used + _size(line) > half_bytes:
            if not tail:
                tail.append(_clip(line, half_bytes, from_end=True))
            break
        tail.append(line)
        used += _size(line)
    tail.reverse()
    kept = "".join(head) + "".join(tail)
    dropped_bytes = _size(text) - _size(kept)
    whole = sum(1 for x in head if x.endswith("\n")) + sum(1 for x in tail if x.endswith("\n"))
    dropped_lines = max(len(lines) - whole, 0)
    marker = f"[... cut from {name}: {dropped_bytes} bytes, {dropped_lines} lines ...]\n"
    head_text = "".join(head)
    if head_text and not head_text.endswith("\n"):
        head_text += "\n"
    return (head_text + marker + "".join(tail)).rstrip("\n")


def _tail(text: str, limit: int, name: str) -> str:
    if _size(text) <= limit:
        return text.rstrip("\n")
    kept = _clip(text, limit, from_end=True)
    dropped = _size(text) - _size(kept)
    return f"[... cut from {name}: first {dropped} bytes ...]\n" + kept.rstrip("\n")


def _compact_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    except ValueError:  # circular structures cannot come from JSON, but be safe
        return repr(value)


def _call_line(call: CallRecord, fields: Mapping[str, Sequence[str]], limit: int) -> str:
    args = _compact_json(call.arguments)
    room = max(limit // 3, 40)
    if len(args) > room:
        args = args[:room] + f"... [{len(args) - room} chars of arguments cut]"
    if call.status == CallStatus.OK:
        declared = fields.get(call.tool, ())
        shown = summarize_result(call.result, declared)
        outcome = "ok " + _compact_json(shown)
    else:
        outcome = f"{call.status} {call.error or ''}".rstrip()
    line = f"#{call.seq} {call.tool}({args}) -> {outcome}"
    if len(line) > limit:
        cut = len(line) - limit
        line = line[:limit] + f" [... {cut} chars cut]"
    return line


def _calls(
    calls: Sequence[CallRecord], fields: Mapping[str, Sequence[str]], budget: ObservationBudget
) -> str:
    header = f"--- calls ({len(calls)}) ---"
    if any(fields.get(c.tool) for c in calls):
        header += "\n(results of tools with declared summary fields show only those fields)"
    chosen = _choose(calls, budget.calls)
    lines = [header]
    previous = 0
    for index in sorted(chosen):
        if index > previous:
            lines.append(_gap(calls, previous, index))
        lines.append(_call_line(calls[index], fields, budget.call_chars))
        previous = index + 1
    if previous < len(calls):
        lines.append(_gap(calls, previous, len(calls)))
    return "\n".join(lines)


def _choose(calls: Sequence[CallRecord], limit: int) -> set[int]:
    """Indices to show: failed calls first, then the first and last ok calls."""
    if len(calls) <= limit:
        return set(range(len(calls)))
    failed = [i for i, c in enumerate(calls) if c.status != CallStatus.OK][:limit]
    chosen = set(failed)
    rest = [i for i in range(len(calls)) if i not in chosen]
    room = limit - len(chosen)
    head = (room + 1) // 2
    chosen.update(rest[:head])
    if room - head > 0:
        chosen.update(rest[-(room - head) :])
    return chosen


def _gap(calls: Sequence[CallRecord], start: int, end: int) -> str:
    first, last = calls[start].seq, calls[end - 1].seq
    span = f"#{first}" if start == end - 1 else f"#{first}..#{last}"
    return f"[... {end - start} calls cut: {span} ...]"


def _cap(text: str, limit: int) -> str:
    if _size(text) <= limit:
        return text
    marker_room = 80
    kept = _clip(text, max(limit - marker_room, 0))
    dropped = _size(text) - _size(kept)
    return kept.rstrip("\n") + f"\n[... observation cut: last {dropped} bytes ...]"
