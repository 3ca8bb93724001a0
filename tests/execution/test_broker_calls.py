"""The broker through real sandboxes: the call log, validation, policy, dispatch modes,
concurrency of read-only calls and serialization of calls with side effects.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest

from sandbox.expectations import ExpectedCalls
from sandbox.handlers import Approval, ToolCall, ToolFailure

if TYPE_CHECKING:
    from tests.conftest import EngineHarness


def tool(
    name: str, props: dict[str, Any] | None = None, required: list[str] | None = None, **xptc: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "description": f"The {name} tool.",
        "parameters": {
            "type": "object",
            "properties": props or {},
            "required": required or [],
        },
    }
    if xptc:
        spec["x-ptc"] = xptc
    return spec


WEATHER = tool(
    "get-weather.v2",
    {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    ["city"],
)


def test_call_log_records_every_field(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\nprint(tools.get_weather_v2(city='Oslo', days=2))\nprint(tools.get_weather_v2(city='Rome'))",
        manifest=[WEATHER],
    )
    assert result.status == "ok"
    assert result.stdout == "{'city': 'Oslo', 'days': 2}\n{'city': 'Rome'}\n"
    first, second = (c.to_json() for c in result.calls)
    assert set(first) == {
        "seq", "tool", "arguments", "status", "result", "start_offset_s", "duration_s", "idempotency_key",
    }  # fmt: skip
    assert (first["seq"], first["tool"], first["arguments"], first["status"]) == (
        1, "get-weather.v2", {"city": "Oslo", "days": 2}, "ok",
    )  # fmt: skip
    assert first["result"] == {"city": "Oslo", "days": 2}
    assert second["arguments"] == {"city": "Rome"}  # omitted optionals are not sent
    assert 0 <= first["start_offset_s"] <= second["start_offset_s"]
    assert first["duration_s"] >= 0
    assert first["idempotency_key"] == f"{result.execution_id}:1"
    assert second["idempotency_key"] == f"{result.execution_id}:2"
    assert result.usage.tool_calls == 2


def test_idempotency_keys_are_unique_across_executions(clean: EngineHarness) -> None:
    keys = set()
    for _ in range(3):
        result = clean.run("import tools\ntools.get_weather_v2(city='x')", manifest=[WEATHER])
        keys.add(result.calls[0].idempotency_key)
    assert len(keys) == 3


def test_handler_sees_the_idempotency_key(clean: EngineHarness) -> None:
    seen: list[tuple[str, int]] = []

    async def host(call: ToolCall) -> Any:
        seen.append((call.idempotency_key, call.seq))
        return "done"

    result = clean.run(
        "import tools\ntools.act()\ntools.act()",
        manifest=[tool("act", mode="host")],
        handlers={"host": host},
    )
    assert seen == [(c.idempotency_key, c.seq) for c in result.calls]


def test_invalid_arguments_raise_naming_the_parameter(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntry:\n    tools.get_weather_v2(city='Oslo', days='two')\n"
        "except tools.InvalidArguments as e:\n    print(type(e).__name__, e)",
        manifest=[WEATHER],
    )
    assert result.status == "ok"
    assert result.stdout.startswith("InvalidArguments ")
    assert "'days'" in result.stdout
    call = result.calls[0]
    assert (call.status, call.arguments) == ("invalid_arguments", {"city": "Oslo", "days": "two"})
    assert call.error is not None and "'days'" in call.error
    assert call.to_json()["error"] == call.error and "result" not in call.to_json()


def test_uncaught_invalid_arguments_is_a_script_error_with_its_line(clean: EngineHarness) -> None:
    result = clean.run("import tools\n\ntools.get_weather_v2(city=3)", manifest=[WEATHER])
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.error is not None
    assert (result.error.type, result.error.line) == ("InvalidArguments", 3)


def test_loop_breaker_refuses_the_same_failing_call(clean: EngineHarness) -> None:
    result = clean.run(
        """
import tools
for _ in range(5):
    try:
        tools.get_weather_v2(city="Oslo", days=0)
    except tools.ToolError as e:
        print(type(e).__name__)
print(tools.get_weather_v2(city="Oslo", days=1))
""",
        manifest=[WEATHER],
    )
    assert result.stdout.splitlines() == [
        "InvalidArguments",
        "InvalidArguments",
        "InvalidArguments",
        "CallRefused",
        "CallRefused",
        "{'city': 'Oslo', 'days': 1}",
    ]
    statuses = [c.status for c in result.calls]
    assert statuses == ["invalid_arguments"] * 3 + ["refused"] * 2 + ["ok"]
    assert result.calls[3].error is not None
    assert "try a different approach" in result.calls[3].error
    assert result.status == "ok"


def test_loop_breaker_counts_handler_failures(clean: EngineHarness) -> None:
    async def flaky(call: ToolCall) -> Any:
        raise ToolFailure("backend down")

    result = clean.run(
        "import tools\nfor _ in range(4):\n    try:\n        tools.fetch()\n    except tools.ToolError as e:\n        print(type(e).__name__, e)",
        manifest=[tool("fetch", mode="host")],
        handlers={"host": flaky},
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == ["ToolError backend down"] * 3
    assert lines[3].startswith("CallRefused this exact call of 'fetch' has already failed 3 times")
    assert [c.status for c in result.calls] == ["error"] * 3 + ["refused"]


def test_handler_exception_is_the_calls_error(clean: EngineHarness) -> None:
    async def buggy(call: ToolCall) -> Any:
        raise KeyError("missing")

    async def weird(call: ToolCall) -> Any:
        return {1, 2}

    result = clean.run(
        "import tools\nfor f in (tools.buggy, tools.weird):\n    try:\n        f()\n    except tools.ToolError as e:\n        print(e)",
        manifest=[tool("buggy", mode="host"), tool("weird", mode="client")],
        handlers={"host": buggy, "client": weird},
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "KeyError: 'missing'"
    assert lines[1].startswith("the tool returned a value that is not JSON")
    assert [c.status for c in result.calls] == ["error", "error"]


def test_oversized_call_is_refused_and_recorded(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntry:\n    tools.get_weather_v2(city='x' * (2 * 1024 * 1024))\n"
        "except tools.CallRefused as e:\n    print(e)\nprint(tools.get_weather_v2(city='ok'))",
        manifest=[WEATHER],
    )
    assert result.status == "ok"
    first = result.stdout.splitlines()[0]
    assert first == (
        "arguments of 2097163 bytes are over the 1048576-byte cap for one call; "
        "pass less data per call"
    )
    assert [(c.tool, c.status, c.arguments) for c in result.calls] == [
        ("get-weather.v2", "refused", None),
        ("get-weather.v2", "ok", {"city": "ok"}),
    ]


def test_unknown_tool_is_refused(clean: EngineHarness) -> None:
    result = clean.run(
        "import _ptc_runtime\ntry:\n    _ptc_runtime.call('nope', {})\nexcept _ptc_runtime.CallRefused as e:\n    print(e)",
        manifest=[WEATHER],
    )
    assert result.stdout == "unknown tool 'nope'; available: get-weather.v2\n"
    assert [(c.tool, c.status) for c in result.calls] == [("nope", "refused")]


def test_echo_and_mock_modes(clean: EngineHarness) -> None:
    manifest = [
        tool("plain", {"x": {"type": "integer"}}),
        tool("canned", {"x": {"type": "integer"}}, mode="mock", mock={"answer": [1, 2, 3]}),
    ]
    result = clean.run(
        "import tools\nprint(tools.plain(x=1))\nprint(tools.canned(x=1))", manifest=manifest
    )
    assert result.stdout == "{'x': 1}\n{'answer': [1, 2, 3]}\n"
    assert [c.result for c in result.calls] == [{"x": 1}, {"answer": [1, 2, 3]}]


def test_mode_without_a_handler_is_refused(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\ntry:\n    tools.remote()\nexcept tools.CallRefused as e:\n    print(e)",
        manifest=[tool("remote", mode="client")],
    )
    assert result.stdout == (
        "'remote' is a 'client'-mode tool and this execution has no handler for that mode\n"
    )


def test_approval(clean: EngineHarness) -> None:
    async def approver(call: ToolCall) -> Approval:
        return Approval(call.arguments.get("amount", 0) < 100, "too much")

    manifest = [tool("pay", {"amount": {"type": "integer"}}, needs_approval=True)]
    script = (
        "import tools\nfor amount in (10, 500):\n    try:\n        print(tools.pay(amount=amount))\n"
        "    except tools.CallDenied as e:\n        print('denied', e)"
    )
    approved = clean.run(script, manifest=manifest, approver=approver)
    assert approved.stdout == "{'amount': 10}\ndenied the call was denied: too much\n"
    assert [c.status for c in approved.calls] == ["ok", "denied"]
    without = clean.run(script, manifest=manifest)
    assert [c.status for c in without.calls] == ["denied", "denied"]
    assert without.calls[0].error == "'pay' needs approval and no approver is connected"


class _Gauge:
    """Counts handler invocations in flight; records the order they started in."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.order: list[int] = []

    async def __call__(self, call: ToolCall) -> Any:
        self.order.append(call.arguments["i"])
        self.active += 1
        self.peak = max(self.peak, self.active)
        await asyncio.sleep(0.05)
        self.active -= 1
        return call.arguments["i"]


FAN_OUT = """
import asyncio, tools
print(await asyncio.gather(*(tools.aio.{name}(i=i) for i in range(8))))
"""


def test_read_only_calls_run_concurrently(clean: EngineHarness) -> None:
    gauge = _Gauge()
    result = clean.run(
        FAN_OUT.format(name="look"),
        manifest=[tool("look", {"i": {"type": "integer"}}, mode="host", read_only=True)],
        handlers={"host": gauge},
    )
    assert result.stdout == "[0, 1, 2, 3, 4, 5, 6, 7]\n"
    assert gauge.peak == 8


def test_side_effect_calls_run_one_at_a_time_in_call_order(clean: EngineHarness) -> None:
    gauge = _Gauge()
    result = clean.run(
        FAN_OUT.format(name="write"),
        manifest=[tool("write", {"i": {"type": "integer"}}, mode="host")],
        handlers={"host": gauge},
    )
    assert result.stdout == "[0, 1, 2, 3, 4, 5, 6, 7]\n"
    assert gauge.peak == 1
    arrival = [c.arguments["i"] for c in sorted(result.calls, key=lambda c: c.seq)]
    assert gauge.order == arrival


def test_an_echo_call_with_side_effects_waits_for_the_side_effect_call_before_it(
    clean: EngineHarness,
) -> None:
    """Echo calls are answered on the channel thread, but not past a host call ahead of them
    that has side effects: those run one at a time in arrival order, whoever serves them."""
    gauge = _Gauge()
    result = clean.run(
        "import asyncio, tools\n"
        "print(await asyncio.gather(tools.aio.write(i=1), tools.aio.note(i=2), tools.aio.peek(i=3)))",
        manifest=[
            tool("write", {"i": {"type": "integer"}}, mode="host"),
            tool("note", {"i": {"type": "integer"}}),
            tool("peek", {"i": {"type": "integer"}}, read_only=True),
        ],
        handlers={"host": gauge},
    )
    assert result.stdout == "[1, {'i': 2}, {'i': 3}]\n"
    write, note, peek = sorted(result.calls, key=lambda c: c.seq)
    assert [c.tool for c in (write, note, peek)] == ["write", "note", "peek"]

    def ended(call: Any) -> float:
        return float(call.start_offset_s + call.duration_s)

    assert ended(note) >= ended(write)  # the handler slept 50 ms; the echo waited for it
    assert ended(peek) < ended(write)  # a read-only echo call did not wait


def test_calls_in_flight_at_the_end_are_recorded_cancelled(clean: EngineHarness) -> None:
    async def slow(call: ToolCall) -> Any:
        await asyncio.sleep(60)

    result = clean.run(
        "import asyncio, tools\nasyncio.get_event_loop_policy()\n"
        "async def go():\n    asyncio.ensure_future(tools.aio.slow())\n    await asyncio.sleep(0.2)\n"
        "asyncio.run(go())\nimport os\nos._exit(0)",
        manifest=[tool("slow", mode="host", read_only=True)],
        handlers={"host": slow},
    )
    assert [(c.status, c.error) for c in result.calls] == [
        ("cancelled", "the execution ended before the call completed")
    ]


@pytest.mark.parametrize(
    ("expected", "violations"),
    [
        (ExpectedCalls("get-weather.v2", 3, 3), []),
        (
            ExpectedCalls("get-weather.v2", 4),
            [(4, 3, "get-weather.v2: expected at least 4 calls, saw 3")],
        ),
        (
            ExpectedCalls("get-weather.v2", None, 2),
            [(2, 3, "get-weather.v2: expected at most 2 calls, saw 3")],
        ),
    ],
    ids=["met", "too-few", "too-many"],
)
def test_expected_calls(
    clean: EngineHarness, expected: ExpectedCalls, violations: list[tuple[int, int, str]]
) -> None:
    result = clean.run(
        "import tools\nfor c in ('a', 'b', 'c'):\n    tools.get_weather_v2(city=c)",
        manifest=[WEATHER],
        expected_calls=(expected,),
    )
    got = [(v.limit_value, v.observed, v.detail) for v in result.violations]
    assert got == violations
    assert all(
        (v.limit, v.action, v.evidence) == ("expected_calls", "reported", "host")
        for v in result.violations
    )
    assert result.status == ("limit_exceeded" if violations else "ok")


def test_refused_calls_do_not_count_as_expected(clean: EngineHarness) -> None:
    result = clean.run(
        "import tools\nfor c in ('a', 'b', 'c'):\n    try:\n        tools.get_weather_v2(city=c)\n    except tools.CallRefused:\n        pass",
        manifest=[WEATHER],
        limits={"max_tool_calls": 2},
        expected_calls=(ExpectedCalls("get-weather.v2", 3),),
    )
    # VIOLATION_ORDER puts the budget before the expectation it caused to fail.
    assert [(v.limit, v.observed) for v in result.violations] == [
        ("max_tool_calls", 3),
        ("expected_calls", 2),
    ]


def test_results_cross_back_as_json(clean: EngineHarness) -> None:
    async def host(call: ToolCall) -> Any:
        return {"nested": [1, 2.5, None, True, "ü"], "n": 2**53}

    result = clean.run(
        "import json, tools\nprint(json.dumps(tools.get(), ensure_ascii=False))",
        manifest=[tool("get", mode="host")],
        handlers={"host": host},
    )
    assert json.loads(result.stdout) == {"nested": [1, 2.5, None, True, "ü"], "n": 2**53}


def test_a_handler_that_ignores_its_cancel_does_not_hold_the_execution(
    clean: EngineHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Embedded, as through `ptc serve` (tests/server/test_host_handler_stuck.py): the wall
    time kills the sandbox, the stop gives the cancelled call `CALL_STOP_GRACE_S` and leaves it,
    the call stays recorded as cancelled; before, the execution never ended."""
    entered = asyncio.Event()
    finished: list[bool] = []  # set at the end, so that the abandoned task ends after all

    async def stubborn(call: ToolCall) -> Any:
        entered.set()
        while not finished:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
        return "late"

    with caplog.at_level("ERROR", logger="sandbox.execution.drive"):
        result = clean.run(
            "import tools\ntools.act()",
            manifest=[tool("act", mode="host")],
            handlers={"host": stubborn},
            limits={"wall_time": 1},
        )
    finished.append(True)  # the abandoned call now ends "ok", late: its record must not change
    clean.call(asyncio.sleep(0.3))
    assert entered.is_set()
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.action) for v in result.violations] == [("wall_time", "killed")]
    assert [(c.tool, c.status, c.error) for c in result.calls] == [
        ("act", "cancelled", "the execution ended before the call completed")
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "sandbox.execution.drive"] == [
        f"execution {result.execution_id}: 1 tasks did not end within 2.0 s of their cancel and"
        " are abandoned (tool calls: act): a handler that ignores cancellation; the calls are"
        " recorded as cancelled"
    ]
