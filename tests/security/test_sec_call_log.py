"""Hostile scripts against the call log's size: every call's arguments and result are kept in
the result and the audit record, so a script that makes many large calls could grow both
without bound (64 echoes of a megabyte made a 122 MiB result). `call_log_bytes` bounds it:
calls whose arguments do not fit are refused, results that do not fit are logged as a marker,
and the violation says how much was cut. Each test checks the engine still serves afterwards.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sandbox.execution.broker import RECORD_OVERHEAD_BYTES

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

MiB = 1 << 20
ECHO = json.dumps(
    [{"name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}]
)
MEGABYTE_ECHOES = """
import tools
ok = refused = 0
for i in range(64):
    try:
        tools.echo(text="y" * 1_000_000)
        ok += 1
    except tools.CallRefused as exc:
        refused += 1
        last = str(exc)
print(ok, refused)
print(last)
"""
ARGS_BYTES = len(json.dumps({"text": "y" * 1_000_000}))  # 1_000_012


def _log_bytes(calls: list[dict[str, object]]) -> int:
    return sum(len(json.dumps(c, ensure_ascii=False).encode()) for c in calls)


def test_megabyte_echoes_are_refused_once_the_log_is_full(clean: EngineHarness) -> None:
    result = clean.run(MEGABYTE_ECHOES, manifest=ECHO)
    assert result.status == "limit_exceeded"
    # Four calls (arguments and echoed result, about 2 MB each) fit the default 8 MiB; the
    # other 60 are refused before they run, and their records keep a marker, not a megabyte.
    assert result.stdout.splitlines() == [
        "4 60",
        f"the call log's budget of {8 * MiB} bytes (call_log_bytes) has no room for this call's "
        f"arguments of {ARGS_BYTES} bytes; pass less data per call, or ask for a larger "
        "call_log_bytes",
    ]
    assert [c.status for c in result.calls] == ["ok"] * 4 + ["refused"] * 60
    assert {c.arguments for c in result.calls[4:]} == {
        f"[ptc: {ARGS_BYTES} bytes of arguments not logged (call_log_bytes)]"
    }
    [violation] = result.violations
    assert (violation.limit, violation.limit_value, violation.unit, violation.action) == (
        "call_log_bytes",
        8 * MiB,
        "bytes",
        "refused",
    )
    assert violation.observed is not None and violation.observed > 64 * ARGS_BYTES
    assert str(violation.evidence) == "host"
    assert "60 calls refused" in violation.detail
    calls = result.to_json()["calls"]
    assert _log_bytes(calls) <= 8 * MiB
    assert result.effective_limits is not None
    assert result.effective_limits.call_log_bytes == 8 * MiB
    clean.assert_healthy()


def test_a_result_that_does_not_fit_reaches_the_script_and_is_logged_as_a_marker(
    clean: EngineHarness,
) -> None:
    result = clean.run(
        "import tools\nprint(len(tools.echo(text='z' * 1_000_000)['text']))",
        manifest=ECHO,
        limits={"call_log_bytes": 1_500_000},
    )
    assert (result.status, result.stdout) == ("limit_exceeded", "1000000\n")
    [call] = result.calls
    assert call.status == "ok"
    assert call.arguments == {"text": "z" * 1_000_000}
    assert isinstance(call.result, str)
    assert call.result.startswith("[ptc: ") and call.result.endswith(
        " bytes of result not logged (call_log_bytes)]"
    )
    assert [(v.limit, v.limit_value, v.action) for v in result.violations] == [
        ("call_log_bytes", 1_500_000, "truncated")
    ]
    assert _log_bytes(result.to_json()["calls"]) <= 1_500_000
    clean.assert_healthy()


def test_calls_past_a_full_log_are_refused_and_counted(clean: EngineHarness) -> None:
    """Even tiny calls cannot grow the log once not even a refusal's record fits."""
    result = clean.run(
        """
import tools
ok = refused = 0
for i in range(500):
    try:
        tools.echo(text="a")
        ok += 1
    except tools.CallRefused:
        refused += 1
print(ok, refused)
""",
        manifest=ECHO,
        limits={"call_log_bytes": 4096},
    )
    ok, refused = map(int, result.stdout.split())
    assert ok + refused == 500 and 0 < ok < 4096 // RECORD_OVERHEAD_BYTES
    assert [c.status for c in result.calls] == ["ok"] * ok
    [violation] = result.violations
    assert (violation.limit, violation.action) == ("call_log_bytes", "refused")
    assert f"{refused} calls refused" in violation.detail
    assert f"{refused} of them not recorded" in violation.detail
    assert _log_bytes(result.to_json()["calls"]) <= 4096
    clean.assert_healthy()


def test_just_under_the_budget_passes(clean: EngineHarness) -> None:
    script = "import tools\nfor i in range(3):\n    tools.echo(text='x' * 1000)"
    over = clean.run(script, manifest=ECHO, limits={"call_log_bytes": 6000})
    under = clean.run(script, manifest=ECHO, limits={"call_log_bytes": 8000})
    assert (under.status, under.violations, len(under.calls)) == ("ok", [], 3)
    assert over.status == "limit_exceeded"
    assert [(v.limit, v.action) for v in over.violations] == [("call_log_bytes", "refused")]
