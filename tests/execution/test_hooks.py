"""`RunHooks`: the one value that carries the host's five hooks into a run. The caller's
handlers win over the defaults it is merged with, and a real run (a real process sandbox)
calls each hook it was given: handlers, approver, on_output, on_started and cancel."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from sandbox.engine import ExecutionRequest, RunHooks, StartedInfo
from sandbox.execution.hooks import NO_HOOKS
from sandbox.handlers import Approval, ToolCall

if TYPE_CHECKING:
    from tests.conftest import EngineHarness


async def _default(call: ToolCall) -> Any:
    return "default"


async def _mine(call: ToolCall) -> Any:
    return "caller"


def test_callers_handlers_win_over_the_defaults() -> None:
    hooks = RunHooks(handlers={"host": _mine}).with_handlers({"host": _default, "client": _default})
    assert dict(hooks.handlers) == {"host": _mine, "client": _default}


def test_no_hooks_has_none_and_merging_leaves_it_unchanged() -> None:
    assert dict(NO_HOOKS.with_handlers({"host": _default}).handlers) == {"host": _default}
    assert dict(NO_HOOKS.handlers) == {}
    assert RunHooks(handlers={}, approver=None, on_output=None, on_started=None) == NO_HOOKS


PAY = {
    "name": "pay",
    "description": "Pays.",
    "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}}},
    "x-ptc": {"mode": "host", "needs_approval": True},
}
SCRIPT = """
import tools, time
for amount in (10, 500):
    try:
        print(tools.pay(amount=amount), flush=True)
    except tools.CallDenied as e:
        print('denied', flush=True)
"""


def test_a_run_calls_every_hook_it_was_given(clean: EngineHarness) -> None:
    started: list[StartedInfo] = []
    chunks: list[tuple[str, bytes]] = []
    paid: list[object] = []

    async def pay(call: ToolCall) -> Any:
        paid.append(call.arguments["amount"])
        return "paid"

    async def approver(call: ToolCall) -> Approval:
        return Approval(call.arguments["amount"] < 100, "too much")

    hooks = RunHooks(
        handlers={"host": pay},
        approver=approver,
        on_output=lambda stream, data: chunks.append((stream, data)),
        on_started=started.append,
        cancel=asyncio.Event(),
    )
    request = ExecutionRequest(script=SCRIPT, manifest=[PAY])
    result = clean.call(clean.engine.execute(request, hooks=hooks))
    assert result.status == "ok", result.to_json()
    assert result.stdout == "paid\ndenied\n"
    assert paid == [10]
    assert [c.status for c in result.calls] == ["ok", "denied"]
    assert [info.execution_id for info in started] == [result.execution_id]
    assert b"".join(data for stream, data in chunks if stream == "stdout") == b"paid\ndenied\n"


def test_a_set_cancel_event_stops_the_run(clean: EngineHarness) -> None:
    async def run() -> Any:
        cancel = asyncio.Event()
        request = ExecutionRequest(script="print('up', flush=True)\nimport time\ntime.sleep(60)")
        hooks = RunHooks(on_output=lambda stream, data: cancel.set(), cancel=cancel)
        return await clean.engine.execute(request, hooks=hooks)

    result = clean.call(run(), timeout=30)
    assert result.status == "cancelled", result.to_json()
    assert result.stdout == "up\n"
