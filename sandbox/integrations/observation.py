"""The observation: what the model reads after its script ran, bounded and honest about cuts.

Sections, in order: a status line (status, exit code, call counts by status), the script's
stdout, one line per tool call, the violations, the script's error and the tail of stderr.
Numbers are printed exactly (integers as integers, sizes in bytes with a binary unit beside them),
never in exponent form. A call's line names its outcome right after the tool: arguments are cut
to a third of the line's budget with an explicit marker, so a long argument never pushes the
outcome off the line. The stderr traceback shows the script's own frames with the script's line
numbers (and source, when the script is known); the frames of the sandbox's runtime, the
generated stubs and the standard library are folded into one counted marker, and so are the
frames of a prelude an adapter put before the model's code (`ScriptSource.prelude_lines`).
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
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.result import CallRecord, CallStatus, ExecutionResult, Violation

__all__ = ["ObservationBudget", "ScriptSource", "render_observation", "summarize_result"]

# The file name the guest compiles the script under (`sandbox/guest/bootstrap.py` SCRIPT_NAME);
# a real execution in tests/integrations/test_observation.py keeps the two in step.
SCRIPT_FILE = "<script>"


@dataclass(frozen=True)
class ObservationBudget:
    """Size bounds of one observation; bytes are UTF-8 bytes."""

    max_bytes: int = 12_000
    stdout_bytes: int = 6_000
    stdout_lines: int = 200
    stderr_bytes: int = 1_000
    calls: int = 30
    call_chars: int = 240


@dataclass(frozen=True)
class ScriptSource:
    """The script that ran, so tracebacks can show its lines. ``prelude_lines`` lines of set-up
    code an adapter put before the model's own code are not the model's: their frames are
    folded away and line numbers count from the model's first line."""

    text: str
    prelude_lines: int = 0

    def line(self, number: int) -> str:
        lines = self.text.splitlines()
        return lines[number - 1].strip() if 0 < number <= len(lines) else ""

    def own(self, number: int) -> int | None:
        """The model's line number for line ``number`` of the script that ran (None: prelude)."""
        return number - self.prelude_lines if number > self.prelude_lines else None


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
    stderr = _script_frames(result.stderr, source) if result.stderr else ""
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
    if result.error is not None:
        error = f"{result.error.type}: {result.error.message}"
        parts.append(f"--- error ---\n{error}{_error_line(result, source)}")
    if stderr and result.error is None:
        parts.append("--- stderr ---\n" + _tail(stderr, budget.stderr_bytes, "stderr"))
    elif stderr:
        # The traceback's last lines name the error already shown; keep the tail only.
        parts.append("--- stderr (tail) ---\n" + _tail(stderr, budget.stderr_bytes, "stderr"))
    return _cap("\n".join(parts), budget.max_bytes)


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


def _error_line(result: ExecutionResult, source: ScriptSource) -> str:
    """`` (line N)`` of the model's code: the traceback's last own frame when the script is
    known (the guest's line may be a prelude line), else the guest's report."""
    assert result.error is not None
    own = [n for n in _frame_lines(result.stderr) if source.own(n) is not None]
    if own:
        line = source.own(own[-1])
    elif source.prelude_lines:
        line = source.own(result.error.line) if result.error.line else None
    else:
        line = result.error.line or None
    return f" (line {line})" if line else ""


_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')


def _frame_lines(stderr: str) -> list[int]:
    """Line numbers of the script's frames in the last traceback of ``stderr``."""
    lines: list[int] = []
    for text in stderr.splitlines():
        if text.startswith("Traceback (most recent call last):"):
            lines = []
        match = _FRAME.match(text)
        if match and match["file"] == SCRIPT_FILE:
            lines.append(int(match["line"]))
    return lines


def _script_frames(stderr: str, source: ScriptSource) -> str:
    """``stderr`` with every traceback reduced to the script's own frames.

    A frame is the ``File ...`` line and the indented source and caret lines under it. Frames of
    other files (the runtime, the stubs, the standard library) and of an adapter's prelude are
    folded into one marker per run; the script's frames get the model's line numbers and, when
    the script is known, its source line."""
    out: list[str] = []
    hidden = 0
    in_frame = False

    def flush() -> None:
        nonlocal hidden
        if hidden:
            out.append(f"  [... {_plural(hidden, 'frame')} of the sandbox runtime hidden ...]")
            hidden = 0

    for text in stderr.splitlines():
        match = _FRAME.match(text)
        if match:
            number = int(match["line"])
            own = source.own(number) if match["file"] == SCRIPT_FILE else None
            in_frame = True
            if own is None:
                hidden += 1
                keep_body = False
                continue
            flush()
            keep_body = not source.text
            out.append(f'  File "{SCRIPT_FILE}", line {own}, in {match["func"]}')
            code = source.line(number)
            if code:
                out.append(f"    {code}")
            continue
        if in_frame and text.startswith("    "):
            if keep_body:
                out.append(text)
            continue
        in_frame = False
        flush()
        out.append(text.replace("_ptc_runtime.", "tools.", 1) if _is_exception(text) else text)
    flush()
    return "\n".join(out) + ("\n" if stderr.endswith("\n") else "")


def _is_exception(text: str) -> bool:
    return text.startswith("_ptc_runtime.") and ":" in text


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
