"""The fake backend (`sandbox.backends.fake`): scripted outcomes through the real session,
broker and engine, with nothing run. And the engine logic that needs no real sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from sandbox.backends.fake import FakeBackend
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult

T = TypeVar("T")
ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
    }
]


def run(script: str, limits: dict[str, object] | None = None, manifest: Any = "[]") -> Any:
    backend = FakeBackend()

    async def scenario() -> tuple[ExecutionResult, FakeBackend]:
        async with Engine(EngineConfig(backends={"process": backend})) as engine:
            request = ExecutionRequest(
                script=script,
                manifest=manifest,
                limits=parse_limit_args(f"{k}={v}" for k, v in (limits or {}).items()),
            )
            return await engine.execute(request), backend

    return asyncio.run(_bounded(scenario()))


async def _bounded(coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wait_for(coro, 30)


def test_output_calls_and_a_clean_exit() -> None:
    result, backend = run(
        'print("hello", 1)\nstderr("warn")\ncall("echo", {"i": 2}, show=True)\n'
        'call("nope", {}, show=True)',
        manifest=ECHO,
    )
    assert (result.status, result.exit_code, result.violations) == ("ok", 0, [])
    assert (
        result.stdout == 'hello 1\n{"i": 2}\n{"error": "unknown tool \'nope\'; available: echo"}\n'
    )
    assert result.stderr == "warn\n"
    assert [(c.seq, c.tool, c.status) for c in result.calls] == [
        (1, "echo", "ok"),
        (2, "nope", "refused"),
    ]
    assert result.isolation == ["fake"]
    assert (backend.started, backend.running, backend.peak_running) == (1, 0, 1)


def test_failure_and_exit_codes_are_the_scripts() -> None:
    result, _ = run('print("a")\nfail("ValueError", "nope")\nprint("never")')
    assert (result.status, result.exit_code, result.stdout) == ("error", 1, "a\n")
    assert result.error is not None
    assert (result.error.type, result.error.message, result.error.line) == ("ValueError", "nope", 2)
    result, _ = run("exit(7)")
    assert (result.status, result.exit_code) == ("error", 7)
    result, _ = run("import os")
    assert result.status == "error"
    assert result.error is not None and result.error.type == "FakeScriptError"


def test_the_real_deadline_kills_a_fake_sandbox() -> None:
    result, backend = run('print("before")\nsleep(60)', limits={"wall_time": 0.3})
    assert (result.status, result.exit_code, result.stdout) == (
        "limit_exceeded",
        -9,
        "before\n",
    )
    assert [(v.limit, v.action, v.evidence) for v in result.violations] == [
        ("wall_time", "killed", "host")
    ]
    assert backend.running == 0


def test_the_call_budget_is_the_brokers() -> None:
    result, _ = run(
        'call("echo", {"i": 1})\ncall("echo", {"i": 2}, show=True)',
        limits={"max_tool_calls": 1},
        manifest=ECHO,
    )
    assert result.status == "limit_exceeded"
    assert [(v.limit, v.limit_value, v.action) for v in result.violations] == [
        ("max_tool_calls", 1, "refused")
    ]
    assert [(c.seq, c.status) for c in result.calls] == [(1, "ok"), (2, "refused")]


# Clamping is the engine's, before any sandbox: tested on the fake backend, nothing run.
def test_limits_above_the_ceiling_are_clamped_and_reported() -> None:
    result, _ = run("print(1)", limits={"wall_time": 100_000})
    assert result.status == "ok"
    assert result.effective_limits is not None
    assert result.effective_limits.wall_time_ms == 600_000
    assert [(a.limit, a.requested, a.applied, a.action) for a in result.adjustments] == [
        ("wall_time", 100_000.0, 600.0, "clamped")
    ]
