"""Hostile scripts that abuse the tool channel: closing it, flooding it, garbage and forged
frames, and far more calls than the budget. The channel's fd is ``sys.argv[1]`` inside the
sandbox. A protocol violation ends the execution with a `protocol` violation; the engine keeps
serving.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sandbox.result import ExecutionResult
    from tests.conftest import EngineHarness

ECHO = json.dumps(
    [
        {
            "name": "echo",
            "description": "Returns its arguments.",
            "parameters": {
                "type": "object",
                "properties": {"i": {"type": "integer"}},
                "required": ["i"],
            },
        }
    ]
)
RAW = """
import json, os, struct, sys, time
fd = int(sys.argv[1])
def frame(obj):
    body = json.dumps(obj).encode()
    os.write(fd, struct.pack(">I", len(body)) + body)
"""


def protocol_kill(result: ExecutionResult) -> str:
    """The detail of the single protocol violation that ended the execution."""
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.action) for v in result.violations] == [("protocol", "killed")]
    assert result.exit_code == -9
    return result.violations[0].detail


def test_closing_the_channel(clean: EngineHarness) -> None:
    result = clean.run(
        RAW
        + """
os.close(fd)
import tools
try:
    tools.echo(i=1)
except tools.ToolError as exc:
    print(type(exc).__name__)
""",
        manifest=ECHO,
    )
    # The script runs on without tools; without a channel it cannot report how it ended, so the
    # result is an error (the host saw a clean exit but no report).
    assert (result.status, result.exit_code, result.violations) == ("error", 0, [])
    assert result.stdout == "ToolError\n"
    assert result.calls == []
    clean.assert_healthy()


def test_garbage_frame(clean: EngineHarness) -> None:
    result = clean.run(RAW + "os.write(fd, b'\\x00\\x00\\x00\\x05hello')\ntime.sleep(30)")
    assert protocol_kill(result).startswith("frame is not UTF-8 JSON")
    clean.assert_healthy()


def test_garbage_flood(clean: EngineHarness) -> None:
    result = clean.run(
        RAW + "while True:\n    os.write(fd, b'\\x00\\x00\\x10\\x00' + os.urandom(4096))"
    )
    assert protocol_kill(result).startswith("frame is not UTF-8 JSON")
    clean.assert_healthy()


def test_frame_length_over_the_cap(clean: EngineHarness) -> None:
    result = clean.run(RAW + "os.write(fd, b'\\xff\\xff\\xff\\xff')\ntime.sleep(30)")
    assert protocol_kill(result) == "frame of 4294967295 bytes is over the 1052672-byte cap"
    clean.assert_healthy()


def test_channel_closed_inside_a_frame(clean: EngineHarness) -> None:
    result = clean.run(RAW + "os.write(fd, struct.pack('>I', 100) + b'{')\nos._exit(0)")
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.action, v.detail) for v in result.violations] == [
        ("protocol", "killed", "channel closed inside a frame body")
    ]
    clean.assert_healthy()


FORGED = {
    "host-result-frame": (
        {"t": "result", "id": 1, "ok": True, "value": 1},
        "unknown frame type 'result'",
    ),
    "second-ready": ({"t": "ready", "pid": 5}, "unexpected ready frame after the job was sent"),
    "not-an-object": ([1, 2, 3], "frame is not a JSON object"),
    "call-id-zero": (
        {"t": "call", "id": 0, "tool": "echo", "args": {}},
        "call id must be an integer in [1, 9007199254740992]",
    ),
    "call-id-bool": (
        {"t": "call", "id": True, "tool": "echo", "args": {}},
        "call id must be an integer in [1, 9007199254740992]",
    ),
    "call-args-list": (
        {"t": "call", "id": 1, "tool": "echo", "args": [1]},
        "call 1: args must be a JSON object",
    ),
    "call-tool-long": (
        {"t": "call", "id": 1, "tool": "x" * 300, "args": {}},
        "call 1: tool name must be a string of 1..256 chars",
    ),
    "end-bad-status": (
        {"t": "end", "status": "pwned", "exit_code": 0},
        "end frame: unknown status",
    ),
    "end-bad-exit": (
        {"t": "end", "status": "ok", "exit_code": 999},
        "exit code must be an integer in [0, 255]",
    ),
    "oversized-negative": (
        {"t": "call", "id": 1, "tool": "echo", "oversized": -1},
        "call 1: oversized size must be an integer in [1, 9007199254740992]",
    ),
}


@pytest.mark.parametrize("name", list(FORGED))
def test_forged_frame(clean: EngineHarness, name: str) -> None:
    frame, detail = FORGED[name]
    result = clean.run(RAW + f"frame({frame!r})\ntime.sleep(30)", manifest=ECHO)
    assert protocol_kill(result) == detail
    clean.assert_healthy()


def test_duplicate_call_id_in_flight(clean: EngineHarness) -> None:
    slow = json.dumps(
        [
            {
                "name": "slow",
                "description": "d",
                "parameters": {"type": "object", "properties": {}},
                "x-ptc": {"mode": "host", "read_only": True},
            }
        ]
    )

    async def never(call: object) -> object:
        import asyncio

        await asyncio.sleep(60)
        return None

    result = clean.run(
        RAW + "frame({'t': 'call', 'id': 7, 'tool': 'slow', 'args': {}})\n"
        "frame({'t': 'call', 'id': 7, 'tool': 'slow', 'args': {}})\ntime.sleep(30)",
        manifest=slow,
        handlers={"host": never},
    )
    assert protocol_kill(result) == "call id 7 is already in flight"
    # The call that was in flight when the sandbox died is recorded as cancelled.
    assert [(c.seq, c.tool, c.status) for c in result.calls] == [(1, "slow", "cancelled")]
    clean.assert_healthy()


def test_forged_end_frame_cannot_claim_success(clean: EngineHarness) -> None:
    result = clean.run(
        RAW + "frame({'t': 'end', 'status': 'ok', 'exit_code': 0, 'error': None})\n"
        "os.close(fd)\ntime.sleep(0.5)\nos._exit(3)"
    )
    # The host trusts the exit status it observed, not the report the script forged.
    assert (result.status, result.exit_code) == ("error", 3), result.to_json()
    clean.assert_healthy()


def test_forged_end_and_hang_up_end_the_run_there(clean: EngineHarness) -> None:
    # The whole of the bootstrap's ending forged (its report, its output closed, its `bye`):
    # the run ends right there and the sandbox is killed, as an os._exit(0) would end it. The
    # script claims nothing it could not claim by exiting, and runs no further: not its sleep,
    # not its exit code.
    result = clean.run(
        RAW + "print('before', flush=True)\n"
        "frame({'t': 'end', 'status': 'ok', 'exit_code': 0, 'error': None})\n"
        "os.close(1)\nos.close(2)\nframe({'t': 'bye'})\nos.close(fd)\n"
        "time.sleep(20)\nos._exit(3)",
        limits={"wall_time": 30},
    )
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "before\n")
    assert result.violations == []
    assert result.usage.wall_time_s < 10, result.to_json()  # ended at the hang-up, not at 20 s
    clean.assert_healthy()


def test_a_hang_up_without_an_end_report_is_an_exit_like_any_other(clean: EngineHarness) -> None:
    result = clean.run(
        RAW + "os.close(1)\nos.close(2)\nframe({'t': 'bye'})\nos.close(fd)\n"
        "time.sleep(0.3)\nos._exit(3)"
    )
    assert (result.status, result.exit_code) == ("error", 3), result.to_json()
    assert result.error is not None and result.error.type == "NoReport"
    clean.assert_healthy()


def test_forged_end_frame_then_a_real_failure(clean: EngineHarness) -> None:
    result = clean.run(
        RAW + "frame({'t': 'end', 'status': 'ok', 'exit_code': 0, 'error': None})\n"
        "raise ValueError('real')"
    )
    assert (result.status, result.exit_code) == ("error", 1)
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("ValueError", "real")
    clean.assert_healthy()


def test_flood_of_raw_call_frames(clean: EngineHarness) -> None:
    result = clean.run(
        RAW
        + """
for i in range(1, 3001):
    frame({"t": "call", "id": 1_000_000 + i, "tool": "echo", "args": {"i": i}})
import tools
try:
    tools.echo(i=0)
except tools.CallRefused:
    print("refused")
""",
        manifest=ECHO,
        limits={"max_tool_calls": 100},
    )
    assert result.stdout == "refused\n"
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.limit_value, v.observed, v.action) for v in result.violations] == [
        ("max_tool_calls", 100, 3001, "refused")
    ]
    statuses = [c.status for c in result.calls]
    assert statuses == ["ok"] * 100 + ["refused"] * 2901
    assert [c.arguments for c in result.calls[:3]] == [{"i": 1}, {"i": 2}, {"i": 3}]
    clean.assert_healthy()


def test_ten_thousand_calls_against_a_budget_of_100(clean: EngineHarness) -> None:
    result = clean.run(
        """
import tools
ok = refused = 0
for i in range(10_000):
    try:
        tools.echo(i=i)
        ok += 1
    except tools.CallRefused:
        refused += 1
print(ok, refused)
""",
        manifest=ECHO,
        limits={"max_tool_calls": 100},
    )
    assert result.stdout == "100 9900\n"
    assert (result.status, result.exit_code) == ("limit_exceeded", 0)
    assert [(v.limit, v.limit_value, v.observed, v.action) for v in result.violations] == [
        ("max_tool_calls", 100, 10_000, "refused")
    ]
    assert len(result.calls) == 10_000
    assert [c.status for c in result.calls] == ["ok"] * 100 + ["refused"] * 9900
    assert {c.error for c in result.calls[100:]} == {"the budget of 100 tool calls is spent"}
    assert result.usage.tool_calls == 10_000
    clean.assert_healthy()


def test_ten_thousand_async_calls_against_a_budget_of_100(clean: EngineHarness) -> None:
    result = clean.run(
        """
import asyncio, tools
outcomes = await asyncio.gather(
    *(tools.aio.echo(i=i) for i in range(10_000)), return_exceptions=True
)
print(sum(not isinstance(o, Exception) for o in outcomes),
      sum(isinstance(o, tools.CallRefused) for o in outcomes))
""",
        manifest=ECHO,
        limits={"max_tool_calls": 100},
    )
    assert result.stdout == "100 9900\n"
    assert [(v.limit, v.observed) for v in result.violations] == [("max_tool_calls", 10_000)]
    clean.assert_healthy()
