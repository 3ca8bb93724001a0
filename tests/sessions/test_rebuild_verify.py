"""How a rebuilt session's replayed cell is checked against its record (`first_difference`):
every part that must match, the phrase that names how it differs, and the order in which the
parts are compared (the first difference is the one reported)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sandbox.files import OutputFile
from sandbox.replay.dispatch import RecordedCalls
from sandbox.result import CallRecord, CallStatus, ExecutionResult, ExecutionStatus, ScriptError
from sandbox.sessions.rebuild import first_difference


def _call(seq: int, q: str, result: object = "hit") -> CallRecord:
    return CallRecord(seq, "search", {"q": q}, CallStatus.OK, result=result)


RECORDED = ExecutionResult(
    execution_id="e1",
    status=ExecutionStatus.OK,
    stdout="0.5\nsame\n",
    stderr="",
    calls=[_call(1, "a")],
    value="41",
    session_id="s-1",
)


def _check(replayed: ExecutionResult, recorded: ExecutionResult = RECORDED) -> str | None:
    return first_difference(recorded, replayed, RecordedCalls(recorded.calls))


def test_an_exact_reproduction_has_no_difference() -> None:
    assert _check(replace(RECORDED, execution_id="e2", calls=[_call(1, "a")])) is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            {"stdout": "0.7\nsame\n"},
            "printed different output: stdout differs: line 1 was '0.5', is '0.7'",
            id="stdout",
        ),
        pytest.param(
            {"stderr": "warning\n"},
            "printed different output: stderr differs: 0 lines recorded, 1 line replayed",
            id="stderr",
        ),
        pytest.param(
            {"value": "42"}, "ended with a different value: was '41', is '42'", id="value"
        ),
        pytest.param(
            {"value": None}, "ended with a different value: was '41', is none", id="no-value"
        ),
        pytest.param(
            {"status": ExecutionStatus.ERROR, "exit_code": 1},
            "ended differently: status was ok, is error",
            id="status",
        ),
        pytest.param(
            {"error": ScriptError("OSError", "no such file")},
            "ended differently: error was none, is OSError: no such file",
            id="error",
        ),
        pytest.param(
            {"calls": [_call(1, "b")]},
            "made different tool calls: call 1 of 'search' has no recorded call with the same "
            "tool and arguments; it was ok",
            id="other-arguments",
        ),
        pytest.param(
            {"calls": []},
            "made different tool calls: recorded call 1 of 'search' (q='a') was not made by "
            "the replay",
            id="call-missing",
        ),
        pytest.param(
            {"calls": [_call(1, "a", result="other")]},
            "made different tool calls: call 1 of 'search' ended ok when recorded, ok now",
            id="call-result",
        ),
    ],
)
def test_each_part_that_differs_is_named(change: dict[str, object], expected: str) -> None:
    assert _check(replace(RECORDED, **change)) == expected  # type: ignore[arg-type]


def test_output_files_compare_by_their_digest() -> None:
    written = replace(RECORDED, output_files=[OutputFile("a.txt", 1, "ab" * 32)])
    assert (
        _check(replace(written, output_files=[OutputFile("a.txt", 1, "ab" * 32, b"x")]), written)
        is None
    )
    assert _check(replace(written, output_files=[OutputFile("a.txt", 1, "cd" * 32)]), written) == (
        "wrote different output files: 'a.txt' differ"
    )
    assert _check(replace(written, output_files=[]), written) == (
        "wrote different output files: 'a.txt' differ"
    )


def test_the_first_difference_is_reported_output_before_value() -> None:
    both = replace(RECORDED, stdout="0.9\nsame\n", value="7", calls=[_call(1, "a")])
    assert _check(both) == ("printed different output: stdout differs: line 1 was '0.5', is '0.9'")


def test_measurements_are_not_compared() -> None:
    """Timings and usage differ on every run; a rebuild compares what the user saw."""
    timed = replace(
        RECORDED,
        calls=[replace(_call(1, "a"), duration_s=9.0, start_offset_s=3.0)],
        started_at=1.0,
        finished_at=99.0,
    )
    assert _check(timed) is None
