"""The observation renderer: bounded sections, explicit cut markers, declared summaries."""

from __future__ import annotations

import json

from sandbox.integrations import ExecuteTool, ObservationBudget, render_observation
from sandbox.integrations import summarize_result as summarize
from sandbox.integrations.runners import EmbeddedRunner
from sandbox.result import (
    CallRecord,
    CallStatus,
    ExecutionResult,
    ExecutionStatus,
    ScriptError,
    Violation,
)


def _result(**fields: object) -> ExecutionResult:
    fields.setdefault("status", ExecutionStatus.OK)
    return ExecutionResult(execution_id="x", **fields)  # type: ignore[arg-type]


def _ok(seq: int, tool: str = "get_weather", result: object = None) -> CallRecord:
    return CallRecord(seq, tool, {"city": f"c{seq}"}, CallStatus.OK, result or {"temp": seq})


def test_small_output_is_shown_whole_without_markers() -> None:
    text = render_observation(_result(stdout="a\nb\n", calls=[_ok(1)]))
    assert "a\nb" in text
    assert '#1 get_weather({"city":"c1"}) -> ok {"temp":1}' in text
    assert "cut" not in text


def test_long_stdout_keeps_head_and_tail_and_counts_what_was_cut() -> None:
    lines = [f"line {i:05d}" for i in range(10_000)]
    stdout = "\n".join(lines) + "\n"
    budget = ObservationBudget(stdout_bytes=1_000, stdout_lines=40)
    text = render_observation(_result(stdout=stdout), budget=budget)
    assert "line 00000" in text and "line 09999" in text
    kept = [line for line in lines if line in text]
    assert len(kept) <= 40
    dropped_bytes = len(stdout.encode()) - sum(len(line) + 1 for line in kept)
    assert f"[... cut from stdout: {dropped_bytes} bytes, {10_000 - len(kept)} lines ...]" in text
    assert len(text.encode()) < 1_500


def test_one_huge_line_is_cut_by_bytes() -> None:
    stdout = "é" * 50_000  # two bytes each: the cut must not split a character
    text = render_observation(_result(stdout=stdout), budget=ObservationBudget(stdout_bytes=1000))
    assert "cut from stdout" in text
    assert "\ufffd" not in text
    assert len(text.encode()) < 1_300


def test_calls_beyond_the_budget_are_cut_with_their_numbers_and_failures_kept() -> None:
    calls = [_ok(i) for i in range(1, 101)]
    calls[49] = CallRecord(
        50, "get_weather", {"city": "Atlantis"}, CallStatus.ERROR, None, "unknown city"
    )
    text = render_observation(_result(calls=calls), budget=ObservationBudget(calls=10))
    assert "100 tool calls (1 error, 99 ok)" in text
    assert '#50 get_weather({"city":"Atlantis"}) -> error unknown city' in text
    shown = [line for line in text.splitlines() if line.startswith("#")]
    assert len(shown) == 10
    assert "#1 " in text and "#100 " in text
    gaps = [line for line in text.splitlines() if line.startswith("[... ") and "calls cut" in line]
    assert sum(int(g.split()[1]) for g in gaps) == 90
    assert "[... 44 calls cut: #6..#49 ...]" in text


def test_a_long_call_line_is_cut_with_a_marker() -> None:
    call = _ok(1, result={"blob": "z" * 5000})
    text = render_observation(_result(calls=[call]), budget=ObservationBudget(call_chars=100))
    line = next(line for line in text.splitlines() if line.startswith("#1"))
    assert line.endswith("chars cut]")
    assert len(line) < 130


def test_summary_fields_keep_the_declared_fields_of_each_result() -> None:
    value = {"temp": 3, "humidity": 9, "wind": {"kph": 5, "dir": "N"}, "raw": "x" * 100}
    assert summarize(value, ["temp", "wind.kph"]) == {"temp": 3, "wind": {"kph": 5}}
    assert summarize([value, value], ["temp"]) == [{"temp": 3}, {"temp": 3}]
    assert summarize("text", ["temp"]) == "text"
    call = _ok(1, result=value)
    text = render_observation(_result(calls=[call]), {"get_weather": ("temp", "wind.kph")})
    assert '-> ok {"temp":3,"wind":{"kph":5}}' in text
    assert "show only those fields" in text


def test_violations_error_and_stderr_are_rendered() -> None:
    result = _result(
        status=ExecutionStatus.LIMIT_EXCEEDED,
        exit_code=1,
        violations=[
            Violation(
                "expected_calls",
                100,
                70,
                "count",
                "refused",
                "get_weather: expected at least 100 calls, saw 70",
            )
        ],
        error=ScriptError("ZeroDivisionError", "division by zero", 3),
        stderr="Traceback ...\n" + "x" * 5000 + "\nZeroDivisionError: division by zero\n",
    )
    text = render_observation(result, budget=ObservationBudget(stderr_bytes=200))
    assert text.startswith("status: limit_exceeded · exit code 1")
    assert (
        "expected_calls (limit 100 count, observed 70, refused): get_weather: expected at least 100 calls, saw 70"
        in text
    )
    assert "ZeroDivisionError: division by zero (line 3)" in text
    assert "[... cut from stderr: first" in text


def test_the_whole_observation_has_a_hard_ceiling_with_a_marker() -> None:
    calls = [_ok(i, result={"v": "y" * 200}) for i in range(1, 30)]
    budget = ObservationBudget(max_bytes=2_000, calls=30, call_chars=400)
    text = render_observation(_result(stdout="s" * 1500, calls=calls), budget=budget)
    assert len(text.encode()) <= 2_000
    assert text.rstrip().endswith("bytes ...]") and "observation cut: last" in text


def test_a_real_execution_with_huge_output_is_bounded(embedded: EmbeddedRunner) -> None:
    execute = ExecuteTool(embedded, budget=ObservationBudget(stdout_bytes=2_000, stdout_lines=20))
    observation = execute.run("for i in range(20000):\n    print('row', i)\n")
    assert observation.result is not None and observation.result.status == "ok"
    text = observation.text
    assert "row 0" in text and "row 19999" in text
    assert "cut from stdout:" in text
    total = len(observation.result.stdout.encode())
    assert total > 100_000
    assert len(text.encode()) < 3_000
    json.dumps(text)  # plain text a framework can carry
