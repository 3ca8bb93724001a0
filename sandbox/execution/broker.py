"""The host-side broker: every stub call is validated, policed, dispatched and recorded here.

Order of checks for one call, each a distinct outcome in the call log:
unknown tool → oversized arguments → call budget (`max_tool_calls`) → call log budget
(`call_log_bytes`) → repeated failing call (loop breaker) → schema validation
(`invalid_arguments`) → approval (`denied`) → handler (`ok` / `error`). Calls of read-only tools
run concurrently; calls of tools with side effects run one at a time, in the order they arrived.
Every call gets a seq, an idempotency key and a record, including calls still in flight when the
execution ends (recorded as `cancelled`).

The call log is bounded: `call_log_bytes` caps what its records hold, counted as the JSON the
result carries (arguments, result or error) plus `RECORD_OVERHEAD_BYTES` per record for its
other fields. What does not fit is never dropped silently, and the two halves of a call are
treated differently on purpose:

- a call whose *arguments* do not fit is refused before it is dispatched (the script sees
  `tools.CallRefused`; the record keeps a marker with the arguments' size). A call that ran
  must have its arguments in the audit log, so the broker does not run what it cannot record;
  refusing first also means no side effect happened that the script was not told about.
- a *result* or error that does not fit is kept in the record as a marker with its size, and
  the script still gets it in full: the tool has already run (a side effect may have
  happened), so refusing the answer afterwards would lie to the script about the call.

Once the budget is spent every later call is refused; when not even a refusal's record fits,
later calls are counted instead of recorded. The `call_log_bytes` violation (`refused` when a
call was refused, else `truncated`) says how many of each, and `observed` is the size the log
would have had with nothing cut.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sandbox.execution import evidence
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
from sandbox.result import CallRecord, CallStatus, Violation
from sandbox.telemetry.spans import CallTracer
from stubs_gen import Manifest, ToolOptions

__all__ = ["RECORD_OVERHEAD_BYTES", "Broker"]

REPEAT_FAILURE_LIMIT = 3
MAX_RESULT_BYTES = 16 * 1024 * 1024
# A record's fields besides its tool name, arguments and result or error (seq, status, timings,
# idempotency key, field names or tags: under 200 bytes as JSON or protobuf) and room for the
# two markers (< 80 bytes each) that may stand in for its arguments and its result or error.
RECORD_OVERHEAD_BYTES = 384


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
        self._sealed = False  # `finish` ran: the records are the result's, no outcome changes
        self._t0 = time.monotonic()
        self._refused_over_budget = 0
        self._seq = 0
        self._log = _LogBudget(limits.call_log_bytes)
        self._trace = CallTracer.create()  # None unless tracing is on

    @property
    def call_count(self) -> int:
        """Calls the script made, including any the call log had no room to record."""
        return self._seq

    def start_clock(self) -> None:
        self._t0 = time.monotonic()

    def violations(self) -> list[Violation]:
        """The broker's own counts: the tool-call budget, then the call log's cap."""
        found = [
            evidence.tool_budget_violation(self.limits.max_tool_calls, self._refused_over_budget),
            self._log.violation(),
        ]
        return [v for v in found if v is not None]

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
                if self._sealed:  # abandoned at the stop: it stays recorded as cancelled
                    return b""
                return self._succeed(call, record, value)
        except ToolFailure as failure:
            with self._lock:
                if self._sealed:
                    return b""
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
        self._seq += 1
        seq = self._seq
        now = time.monotonic()
        record = CallRecord(
            seq=seq,
            tool=call.tool,
            arguments=call.arguments,
            start_offset_s=now - self._t0,
            idempotency_key=f"{self.execution_id}:{seq}",
        )
        if self._trace is not None:
            self._trace.start(record)
        if self._log.admit(record, call):
            self.calls.append(record)
        return record

    def _succeed(self, call: GuestCall, record: CallRecord, value: Any) -> bytes:
        frame = _result_frame(call.id, value)  # raises ToolFailure for a value it cannot send
        record.status = CallStatus.OK
        record.result = self._log.keep_result(record, value, len(frame))
        record.duration_s = time.monotonic() - self._t0 - record.start_offset_s
        if self._trace is not None:
            self._trace.end(record, value)
        return frame

    def _fail(self, call: GuestCall, record: CallRecord, failure: ToolFailure) -> bytes:
        invalid = isinstance(failure, _InvalidArguments)
        record.status = CallStatus.INVALID_ARGUMENTS if invalid else _STATUS[failure.kind]
        record.error = self._log.keep_error(record, failure.message)
        record.duration_s = time.monotonic() - self._t0 - record.start_offset_s
        if record.status in (CallStatus.ERROR, CallStatus.INVALID_ARGUMENTS):
            self._failures[_call_key(call)] += 1
        if self._trace is not None:
            self._trace.end(record)
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
        unlogged = self._log.refused(record)  # taken first: whichever check refuses the call
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
        if unlogged is not None:
            raise ToolFailure(
                f"the call log's budget of {self.limits.call_log_bytes} bytes (call_log_bytes) "
                f"has no room for this call's arguments of {unlogged} bytes; pass less data per "
                "call, or ask for a larger call_log_bytes",
                "refused",
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
        if self._trace is not None:  # the call's span is its handler's parent
            with self._trace.current(call):
                return await self._dispatch_now(call)
        return await self._dispatch_now(call)

    async def _dispatch_now(self, call: ToolCall) -> Any:
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
        """Marks calls still without an outcome as cancelled (the execution ended first); a
        call that ends later (abandoned at the stop) changes nothing."""
        with self._lock:
            self._sealed = True
        for record in self.calls:
            if record.status == CallStatus.CANCELLED and record.error is None:
                record.error = "the execution ended before the call completed"
        if self._trace is not None:
            self._trace.finish(self.calls)


class _LogBudget:
    """The call log's byte budget: what each record may keep, and what was cut.

    The broker's lock guards it. Sizes are those of the JSON the result carries (UTF-8, as
    `sandbox.codec.result` and the audit codec write it). Each record is charged its tool name and
    `RECORD_OVERHEAD_BYTES`, which covers its other fields and the (at most two) markers it may
    get, so the kept records never hold more than the limit.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0  # bytes the kept records hold
        self.wanted = 0  # bytes they would hold with nothing cut
        self.refused_calls = 0
        self.cut_values = 0  # results and errors kept as a marker
        self.unrecorded = 0  # refused calls not even a record had room for
        self._first_unrecorded = 0  # from this seq on, no call is recorded (0: none yet)
        self._refused: dict[int, int] = {}  # seq → size of the arguments, until `refused`

    def _take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def admit(self, record: CallRecord, call: GuestCall) -> bool:
        """Charges a new record; False when it cannot be kept at all (only counted)."""
        base = RECORD_OVERHEAD_BYTES + len(call.tool.encode("utf-8", "surrogatepass"))
        size = _json_bytes(call.arguments) if call.arguments is not None else 0
        self.wanted += base + size
        if not self._first_unrecorded and self._take(base + size):
            return True
        self.refused_calls += 1
        self._refused[record.seq] = size
        record.arguments = _marker(size, "arguments")
        if not self._first_unrecorded and self._take(base):
            return True
        self._first_unrecorded = self._first_unrecorded or record.seq
        self.unrecorded += 1
        return False

    def refused(self, record: CallRecord) -> int | None:
        """The size of the arguments that had no room, once, for the call's refusal."""
        return self._refused.pop(record.seq, None)

    def _recorded(self, record: CallRecord) -> bool:
        return not self._first_unrecorded or record.seq < self._first_unrecorded

    def keep_result(self, record: CallRecord, value: Any, size: int) -> Any:
        if not self._recorded(record):
            return value
        self.wanted += size
        if self._take(size):
            return value
        self.cut_values += 1
        return _marker(size, "result")  # within the record's overhead

    def keep_error(self, record: CallRecord, message: str) -> str:
        if not self._recorded(record):
            return message
        data = message.encode("utf-8", "surrogatepass")
        self.wanted += len(data)
        if self._take(len(data)):
            return message
        self.cut_values += 1
        room = max(0, self.limit - self.used)
        self.used += room
        kept = data[:room].decode("utf-8", "ignore")
        return kept + _marker(len(data) - len(kept.encode("utf-8", "surrogatepass")), "error")

    def violation(self) -> Violation | None:
        return evidence.call_log_violation(
            self.limit, self.wanted, self.used, self.refused_calls, self.unrecorded, self.cut_values
        )


def _marker(size: int, what: str) -> str:
    """What a record keeps instead of a value the budget had no room for (< 80 bytes)."""
    return f"[ptc: {size} bytes of {what} not logged (call_log_bytes)]"


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


# Sizes as the wire writes JSON (`sandbox.codec.values.json_text`): compact enough, UTF-8, NaN
# allowed (the guest's JSON parser accepts it), lone surrogates counted as their three bytes.
_SIZE_ENCODER = json.JSONEncoder(ensure_ascii=False)


def _json_bytes(value: Any) -> int:
    return len(_SIZE_ENCODER.encode(value).encode("utf-8", "surrogatepass"))


def _call_key(call: GuestCall) -> str:
    return call.tool + "\x00" + json.dumps(call.arguments, sort_keys=True, default=str)
