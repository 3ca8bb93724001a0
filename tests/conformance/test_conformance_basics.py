"""What every backend does the same for an ordinary script: output, tool calls through the
broker, script errors with their line, exit codes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .conftest import Harness

ADD = [
    {
        "name": "add",
        "description": "adds",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
    }
]


def test_output_on_both_streams(clean: Harness) -> None:
    result = clean.run("import sys\nprint(1)\nprint('err', file=sys.stderr)")
    assert (result.status, result.exit_code, result.violations) == ("ok", 0, [])
    assert (result.stdout, result.stderr) == ("1\n", "err\n")
    assert result.backend == clean.name


def test_tool_calls_go_through_the_broker(clean: Harness) -> None:
    result = clean.run("import tools\nfor i in range(3):\n    print(tools.add(a=i))", manifest=ADD)
    assert result.status == "ok", result.stderr
    assert [c.tool for c in result.calls] == ["add", "add", "add"]
    assert [c.arguments for c in result.calls] == [{"a": 0}, {"a": 1}, {"a": 2}]
    assert [c.seq for c in result.calls] == [1, 2, 3]


def test_script_error_and_exit_codes(clean: Harness) -> None:
    result = clean.run("x = 1\nraise ValueError('nope')")
    assert (result.status, result.exit_code, result.violations) == ("error", 1, [])
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == (
        "ValueError",
        "nope",
        2,
    )
    result = clean.run("import sys\nsys.exit(7)")
    assert (result.status, result.exit_code) == ("error", 7)
