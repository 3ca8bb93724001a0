"""Tool calls answered from a record: the replay's handler for every mode, and its approver.

The broker runs its own checks first (schema, budgets, repeats: against the manifest and limits
of the replay), then asks the approver (for tools that need approval) and the handler. Both
answer from the record: the first recorded call not yet taken with the same tool and the same
arguments (compared as JSON values) answers, in the way it ended:

- `ok`: its result; when the record kept a marker instead of the result (`call_log_bytes`),
  the call is refused and counted `inexact`, since the real result is not in the record;
- `error`: the same error (`inexact` too when the message was cut);
- `denied`: the approver denies it with the recorded message;
- `refused`, `invalid_arguments`, `cancelled`: the tool never ran, so there is no result to give;
  the call is refused with a message that says so (and `compare` shows the changed outcome).

A call with no recorded counterpart is refused (``unmatched``): nothing is invented. Calls the
broker refused before dispatch never reach here; `RecordedCalls.take` matches them afterwards.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from typing import Any

from sandbox.handlers import Approval, ToolCall, ToolFailure, ToolHandler
from sandbox.result import CallRecord, CallStatus

__all__ = ["MODES", "RecordedCalls", "ReplayDispatch", "cut_by_call_log"]

MODES = ("echo", "mock", "host", "client")  # stubs_gen's tool modes: every one is answered here

_RESULT_MARKER = re.compile(r"\[ptc: \d+ bytes of result not logged \(call_log_bytes\)\]")
_ERROR_MARKER = re.compile(r"\[ptc: \d+ bytes of error not logged \(call_log_bytes\)\]$")


def _key(tool: str, arguments: Any) -> str:
    return tool + "\x00" + json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


def cut_by_call_log(call: CallRecord) -> bool:
    """The record kept a marker instead of this call's result or the end of its error."""
    if call.status == CallStatus.OK:
        return isinstance(call.result, str) and _RESULT_MARKER.fullmatch(call.result) is not None
    return isinstance(call.error, str) and _ERROR_MARKER.search(call.error) is not None


class RecordedCalls:
    """The recorded call log, taken call by call as the replay makes its calls."""

    def __init__(self, calls: Sequence[CallRecord]) -> None:
        self.recorded = list(calls)
        self._keys = [_key(c.tool, c.arguments) for c in self.recorded]
        self._free = [True] * len(self.recorded)
        self._by_seq: dict[int, CallRecord | None] = {}
        self._lock = threading.Lock()

    def take(self, seq: int, tool: str, arguments: Any) -> CallRecord | None:
        """The recorded call that answers the replay's call ``seq`` (the same one every time it
        is asked), or None when every recorded call of that tool and arguments is taken."""
        with self._lock:
            if seq in self._by_seq:
                return self._by_seq[seq]
            key = _key(tool, arguments)
            found: CallRecord | None = None
            for index, free in enumerate(self._free):
                if free and self._keys[index] == key:
                    self._free[index] = False
                    found = self.recorded[index]
                    break
            self._by_seq[seq] = found
            return found

    def untaken(self) -> list[CallRecord]:
        with self._lock:
            return [c for c, free in zip(self.recorded, self._free, strict=True) if free]


class ReplayDispatch:
    """The handlers (one per mode) and approver of one replay."""

    def __init__(self, calls: Sequence[CallRecord]) -> None:
        self.calls = RecordedCalls(calls)

    def handlers(self) -> dict[str, ToolHandler]:
        return {mode: self.handle for mode in MODES}

    def _recorded(self, call: ToolCall) -> CallRecord:
        recorded = self.calls.take(call.seq, call.tool.name, call.arguments)
        if recorded is None:
            raise ToolFailure(
                f"replay: the recording has no call of {call.tool.name!r} with these arguments "
                "left to answer this one; a replay runs no tool",
                "refused",
            )
        return recorded

    async def approve(self, call: ToolCall) -> Approval:
        recorded = self._recorded(call)
        if recorded.status == CallStatus.DENIED:
            # The recorded message exactly (it may not be an approver's: no approver connected).
            raise ToolFailure(recorded.error or "the call was denied", "denied")
        return Approval(True)

    async def handle(self, call: ToolCall) -> Any:
        recorded = self._recorded(call)
        if recorded.status == CallStatus.OK:
            if cut_by_call_log(recorded):
                raise ToolFailure(
                    f"replay: the result of recorded call {recorded.seq} was not logged "
                    "(call_log_bytes), so it cannot be replayed",
                    "refused",
                )
            return recorded.result
        if recorded.status == CallStatus.ERROR:
            raise ToolFailure(recorded.error or "", "error")
        raise ToolFailure(
            f"replay: recorded call {recorded.seq} ended {recorded.status} "
            f"({recorded.error or 'no message'}): the tool never ran, so the record holds no "
            "result for it",
            "refused",
        )
