"""The observation renderer: bounded sections, explicit cut markers, declared summaries."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from sandbox.integrations import ExecuteTool, ObservationBudget, render_observation
from sandbox.integrations import summarize_result as summarize
from sandbox.integrations.observation import ScriptSource
from sandbox.integrations.runners import EmbeddedRunner
from sandbox.result import (
    CallRecord,
    CallStatus,
    ExecutionResult,
    ExecutionStatus,
    ScriptError,
    Violation,
)


def _violation(*args: object) -> Violation:
    # Host evidence for these cases, where `Violation` has the field.
    extra = {"evidence": "host"} if "evidence" in {f.name for f in fields(Violation)} else {}
    return Violation(*args, **extra)  # type: ignore[arg-type]


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
            _violation(
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
        "expected_calls: get_weather: expected at least 100 calls, saw 70 (checked after the script ended)"
        in text
    )
    assert "refused" not in text
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


def test_sizes_and_times_are_printed_exactly_with_binary_units() -> None:
    result = _result(
        status=ExecutionStatus.LIMIT_EXCEEDED,
        violations=[
            _violation("stdout_bytes", 1_048_576, 1_048_577, "bytes", "truncated"),
            _violation("memory", 268_435_456, 11_612_160, "bytes", "killed"),
            _violation("wall_time", 2.5, 2.5031, "s", "killed"),
            _violation("processes", 64, 65, "count", "refused"),
        ],
    )
    text = render_observation(result)
    assert "e+" not in text
    lines = text.splitlines()[-4:]
    assert lines == [
        "stdout_bytes: limit 1048576 bytes (1 MiB), observed 1048577 bytes (1.0 MiB), action truncated",
        "memory: limit 268435456 bytes (256 MiB), observed 11612160 bytes (11.1 MiB), action killed",
        "wall_time: limit 2.5 s, observed 2.5031 s, action killed",
        "processes: limit 64, observed 65, action refused",
    ]


def test_one_call_is_singular() -> None:
    assert render_observation(_result(calls=[_ok(1)])).startswith(
        "status: ok · exit code 0 · 1 tool call (1 ok)"
    )
    assert render_observation(_result()).startswith("status: ok · exit code 0 · 0 tool calls")
    two = render_observation(_result(calls=[_ok(1), _ok(2)]))
    assert two.startswith("status: ok · exit code 0 · 2 tool calls (2 ok)")


def test_long_arguments_never_push_the_outcome_off_the_line() -> None:
    failed = CallRecord(
        1, "echo", {"text": "y" * 1_000_000}, CallStatus.ERROR, None, "argument too large"
    )
    ok = CallRecord(2, "echo", {"text": "z" * 5000}, CallStatus.OK, {"n": 1})
    text = render_observation(_result(calls=[failed, ok]))
    lines = [line for line in text.splitlines() if line.startswith("#")]
    assert lines[0] == (
        '#1 echo({"text":"' + "y" * 71 + "... [999931 chars of arguments cut]) "
        "-> error argument too large"
    )
    assert lines[1].endswith(' -> ok {"n":1}')
    assert all(len(line) <= 240 for line in lines)


# The guest's traceback of a failing tool call, as the process backend prints it.
_TOOL_TRACEBACK = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/asyncio/runners.py", line 190, in run
    return runner.run(main)
           ^^^^^^^^^^^^^^^^
  File "<script>", line 6, in <module>
  File "<script>", line 4, in g
  File "tools.py", line 31, in get_weather
  File "/ptc/_ptc_runtime.py", line 264, in call
    return _require().call(tool, arguments)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/ptc/_ptc_runtime.py", line 244, in _outcome
    raise error(str(reply.get("message", "tool call failed")), tool)
_ptc_runtime.InvalidArguments: argument 'city': expected string, got 5
"""
_SCRIPT = "import tools\n\ndef g():\n    return tools.get_weather(city=5)\n\nprint(g())\n"


def _failed(stderr: str, line: int) -> ExecutionResult:
    return _result(
        status=ExecutionStatus.ERROR,
        exit_code=1,
        stderr=stderr,
        error=ScriptError("InvalidArguments", "argument 'city': expected string, got 5", line),
    )


def test_the_stderr_traceback_shows_the_scripts_frames_only() -> None:
    text = render_observation(_failed(_TOOL_TRACEBACK, 4), script=ScriptSource(_SCRIPT))
    tail = text.split("--- stderr (tail) ---\n", 1)[1]
    assert tail.splitlines() == [
        "Traceback (most recent call last):",
        "  [... 1 frame of the sandbox runtime hidden ...]",
        '  File "<script>", line 6, in <module>',
        "    print(g())",
        '  File "<script>", line 4, in g',
        "    return tools.get_weather(city=5)",
        "  [... 3 frames of the sandbox runtime hidden ...]",
        "tools.InvalidArguments: argument 'city': expected string, got 5",
    ]
    assert "InvalidArguments: argument 'city': expected string, got 5 (line 4)" in text
    # Without the script: the same frames, no source lines.
    bare = render_observation(_failed(_TOOL_TRACEBACK, 4))
    assert '  File "<script>", line 4, in g\n  [... 3 frames' in bare
    assert "_ptc_runtime" not in bare and "asyncio" not in bare


def test_a_prelude_is_hidden_and_lines_count_from_the_models_code() -> None:
    prelude = "import tools as _t\ndef get_weather(*a, **k):\n    return _t.get_weather(**k)\n"
    code = "x = 1\nget_weather(city=5)\n"
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "<script>", line 5, in <module>\n'
        '  File "<script>", line 3, in get_weather\n'
        '  File "tools.py", line 31, in get_weather\n'
        "_ptc_runtime.InvalidArguments: argument 'city': expected string, got 5\n"
    )
    text = render_observation(_failed(stderr, 3), script=ScriptSource(prelude + code, 3))
    assert "expected string, got 5 (line 2)" in text
    tail = text.split("--- stderr (tail) ---\n", 1)[1]
    assert tail.splitlines()[1:4] == [
        '  File "<script>", line 2, in <module>',
        "    get_weather(city=5)",
        "  [... 2 frames of the sandbox runtime hidden ...]",
    ]
    assert "_t.get_weather" not in text


def test_a_real_failing_tool_call_shows_the_scripts_lines(embedded: EmbeddedRunner) -> None:
    def get_weather(city: str) -> dict[str, object]:
        """Weather.

        Args:
            city: the city.
        """
        return {"city": city}

    observation = ExecuteTool(embedded, [get_weather]).run(_SCRIPT)
    assert observation.result is not None and observation.result.status == "error"
    tail = observation.text.split("--- stderr (tail) ---\n", 1)[1].splitlines()
    assert [line for line in tail if "<script>" in line or line.startswith("    ")] == [
        '  File "<script>", line 6, in <module>',
        "    print(g())",
        '  File "<script>", line 4, in g',
        "    return tools.get_weather(city=5)",
    ]
    assert tail[-1] == "tools.InvalidArguments: argument 'city': expected string, got 5"
    assert "_ptc_runtime" not in observation.text


def test_a_smolagents_action_error_points_at_the_actions_own_line(
    embedded: EmbeddedRunner,
) -> None:
    import pytest
    from smolagents import tool

    from sandbox.integrations.smolagents import SandboxExecutionError, SandboxExecutor

    @tool  # type: ignore[untyped-decorator]  # smolagents ships no type information
    def get_weather(city: str) -> dict[str, Any]:
        """Current weather for a city.

        Args:
            city: the city's name.
        """
        return {"city": city}

    executor = SandboxExecutor(embedded)
    executor.send_tools({"get_weather": get_weather})
    with pytest.raises(SandboxExecutionError) as failure:
        executor("x = 1\nget_weather(city=3)\n")
    text = str(failure.value)
    assert "InvalidArguments: argument 'city': expected string, got 3 (line 2)" in text
    tail = text.split("--- stderr (tail) ---\n", 1)[1].splitlines()
    assert [line for line in tail if "<script>" in line or line.startswith("    ")] == [
        '  File "<script>", line 2, in <module>',
        "    get_weather(city=3)",
    ]
    assert "_ptc_tools" not in text
