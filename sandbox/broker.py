"""The host-side broker: every stub call is validated, policed, dispatched and recorded here.

Order of checks for one call, each a distinct outcome in the call log:
unknown tool → oversized arguments → call budget (`max_tool_calls`) → repeated failing call
(loop breaker) → schema validation (`invalid_arguments`) → approval (`denied`) → handler
(`ok` / `error`). Calls of read-only tools run concurrently; calls of tools with side effects
run one at a time, in the order they arrived. Every call gets a seq, an idempotency key and a
record, including calls still in flight when the execution ends (recorded as `cancelled`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sandbox.handlers import (
    Approver,
    ToolCall,
    ToolFailure,
    ToolHandler,
    echo_handler,
    mock_handler,
)
from sandbox.limits import ResolvedLimits
from sandbox.protocol import GuestCall, encode_frame
from sandbox.result import CallRecord, CallStatus, Evidence, Violation
from stubs_gen import Manifest, ToolOptions

__all__ = ["Broker"]

REPEAT_FAILURE_LIMIT = 3
MAX_RESULT_BYTES = 16 * 1024 * 1024


class Broker:
    """Serves the tool calls of one execution."""

    def __init__(
        self,
        execution_id: str,
        manifest: Manifest,
        limits: ResolvedLimits,
        handlers: Mapping[str, ToolHandler],
        approver: Approver | None = None,
        max_call_bytes: int = 1 << 20,
        repeat_failure_limit: int = REPEAT_FAILURE_LIMIT,
    ) -> None:
        self.execution_id = execution_id
        self.manifest = manifest
        self.limits = limits
        self.handlers = handlers
        self.approver = approver
        self.max_call_bytes = max_call_bytes
        self.repeat_failure_limit = repeat_failure_limit
        self.calls: list[CallRecord] = []
        self._failures: Counter[str] = Counter()
        self._side_effects = asyncio.Lock()
        self._side_effects_waiting = 0  # side-effect calls handed to `complete`, not yet done
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        self._refused_over_budget = 0

    def start_clock(self) -> None:
        self._t0 = time.monotonic()

    def violations(self) -> list[Violation]:
        if not self._refused_over_budget:
            return []
        attempted = self.limits.max_tool_calls + self._refused_over_budget
        return [
            Violation(
                "max_tool_calls",
                float(self.limits.max_tool_calls),
                float(attempted),
                "count",
                "refused",
                f"{self._refused_over_budget} calls over the budget were refused",
                evidence=Evidence.HOST,
            )
        ]

    def receive(self, call: GuestCall) -> tuple[CallRecord, bytes | None]:
        """Records a call as it arrives (its seq is its arrival order) and, when it completes
        without waiting (a built-in echo or mock tool, no approval, no side-effect call ahead of
        it, or a refusal), answers it at once. Otherwise the reply is None and `complete` gives
        it later. Thread-safe: the channel thread calls this while handlers run on the loop."""
        with self._lock:
            record = self._record(call)
            spec = self.manifest.tool(call.tool)
            if spec is not None and not self._immediate(spec.options):
                if not spec.options.read_only:
                    self._side_effects_waiting += 1
                return record, None
            try:
                tool_call = self._admit(call, record)
                value = _IMMEDIATE_VALUE[tool_call.tool.options.mode](tool_call)
                return record, self._succeed(call, record, value)
            except ToolFailure as failure:
                return record, self._fail(call, record, failure)

    def _immediate(self, options: ToolOptions) -> bool:
        mode = options.mode
        return (
            mode in _IMMEDIATE
            and self.handlers.get(mode) is _IMMEDIATE[mode]
            and not options.needs_approval
            and (options.read_only or not self._side_effects_waiting)
        )

    async def complete(self, call: GuestCall, record: CallRecord) -> bytes:
        """Answers a call that `receive` did not: checks, approval, handler."""
        read_only = self._read_only(call)
        try:
            with self._lock:
                tool_call = self._admit(call, record)
            if read_only:
                value = await self._dispatch(tool_call)
            else:
                # FIFO: side-effect calls run one at a time, in the order they arrived.
                async with self._side_effects:
                    value = await self._dispatch(tool_call)
            with self._lock:
                return self._succeed(call, record, value)
        except ToolFailure as failure:
            with self._lock:
                return self._fail(call, record, failure)
        finally:
            if not read_only:
                with self._lock:
                    self._side_effects_waiting -= 1

    async def handle(self, call: GuestCall) -> bytes:
        """`receive` and, when needed, `complete`: one call's encoded reply frame."""
        record, reply = self.receive(call)
        return reply if reply is not None else await self.complete(call, record)

    def _read_only(self, call: GuestCall) -> bool:
        spec = self.manifest.tool(call.tool)
        return spec is None or spec.options.read_only

    def _record(self, call: GuestCall) -> CallRecord:
        seq = len(self.calls) + 1
        now = time.monotonic()
        record = CallRecord(
            seq=seq,
            tool=call.tool,
            arguments=call.arguments,
            start_offset_s=now - self._t0,
            idempotency_key=f"{self.execution_id}:{seq}",
        )
        self.calls.append(record)
        return record

    def _succeed(self, call: GuestCall, record: CallRecord, value: Any) -> bytes:
        frame = _result_frame(call.id, value)  # raises ToolFailure for a value it cannot send
        record.status = CallStatus.OK
        record.result = value
        record.duration_s = time.monotonic() - self._t0 - record.start_offset_s
        return frame

    def _fail(self, call: GuestCall, record: CallRecord, failure: ToolFailure) -> bytes:
        invalid = isinstance(failure, _InvalidArguments)
        record.status = CallStatus.INVALID_ARGUMENTS if invalid else _STATUS[failure.kind]
        record.error = failure.message
        record.duration_s = time.monotonic() - self._t0 - record.start_offset_s
        if record.status in (CallStatus.ERROR, CallStatus.INVALID_ARGUMENTS):
            self._failures[_call_key(call)] += 1
        return encode_frame(
            {
                "t": "result",
                "id": call.id,
                "ok": False,
                "kind": _KIND[record.status],
                "message": failure.message,
            }
        )

    def _admit(self, call: GuestCall, record: CallRecord) -> ToolCall:
        """The checks before dispatch, in the documented order; raises ToolFailure."""
        spec = self.manifest.tool(call.tool)
        if spec is None:
            names = ", ".join(t.name for t in self.manifest.tools) or "none"
            raise ToolFailure(f"unknown tool {call.tool!r}; available: {names}", "refused")
        if call.arguments is None:
            raise ToolFailure(
                f"arguments of {call.oversized_bytes} bytes are over the "
                f"{self.max_call_bytes}-byte cap for one call; pass less data per call",
                "refused",
            )
        if record.seq > self.limits.max_tool_calls:
            self._refused_over_budget += 1
            raise ToolFailure(
                f"the budget of {self.limits.max_tool_calls} tool calls is spent", "refused"
            )
        failures = self._failures[_call_key(call)] if self._failures else 0
        if failures >= self.repeat_failure_limit:
            raise ToolFailure(
                f"this exact call of {call.tool!r} has already failed {failures} times; try a "
                "different approach (other arguments or another tool) instead of repeating it",
                "refused",
            )
        problems = self.manifest.validate(call.tool, call.arguments)
        if problems:
            raise _InvalidArguments("; ".join(problems))
        return ToolCall(self.execution_id, record.seq, spec, call.arguments, record.idempotency_key)

    async def _dispatch(self, call: ToolCall) -> Any:
        if call.tool.options.needs_approval:
            if self.approver is None:
                raise ToolFailure(
                    f"{call.tool.name!r} needs approval and no approver is connected", "denied"
                )
            decision = await self.approver(call)
            if not decision.approved:
                reason = f": {decision.reason}" if decision.reason else ""
                raise ToolFailure(f"the call was denied{reason}", "denied")
        handler = self.handlers.get(call.tool.options.mode)
        if handler is None:
            raise ToolFailure(
                f"{call.tool.name!r} is a {call.tool.options.mode!r}-mode tool and this "
                "execution has no handler for that mode",
                "refused",
            )
        try:
            return await handler(call)
        except ToolFailure:
            raise
        except Exception as exc:  # a handler's bug is the call's error, not the server's
            raise ToolFailure(f"{type(exc).__name__}: {exc}") from exc

    def finish(self) -> None:
        """Marks calls still without an outcome as cancelled (the execution ended first)."""
        for record in self.calls:
            if record.status == CallStatus.CANCELLED and record.error is None:
                record.error = "the execution ended before the call completed"


class _InvalidArguments(ToolFailure):
    def __init__(self, message: str) -> None:
        super().__init__(message, "error")


_STATUS = {
    "error": CallStatus.ERROR,
    "denied": CallStatus.DENIED,
    "refused": CallStatus.REFUSED,
}
_KIND = {
    CallStatus.ERROR: "error",
    CallStatus.DENIED: "denied",
    CallStatus.REFUSED: "refused",
    CallStatus.INVALID_ARGUMENTS: "invalid_arguments",
}


_IMMEDIATE: dict[str, ToolHandler] = {"echo": echo_handler, "mock": mock_handler}
_IMMEDIATE_VALUE = {
    "echo": lambda call: call.arguments,
    "mock": lambda call: call.tool.options.mock,
}


def _result_frame(call_id: int, value: Any) -> bytes:
    """The reply frame of a successful call; the result is encoded once, here, and checked."""
    try:
        frame = encode_frame({"t": "result", "id": call_id, "ok": True, "value": value})
    except (TypeError, ValueError) as exc:
        raise ToolFailure(f"the tool returned a value that is not JSON: {exc}") from exc
    if len(frame) > MAX_RESULT_BYTES:
        raise ToolFailure(
            f"the tool's result of {len(frame)} bytes is over the {MAX_RESULT_BYTES}-byte cap"
        )
    return frame


def _call_key(call: GuestCall) -> str:
    return call.tool + "\x00" + json.dumps(call.arguments, sort_keys=True, default=str)
