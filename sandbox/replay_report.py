"""`ReplayReport`: what a replay found, the same embedded, from the CLI and through the RPC.

A `Difference` names what differs (``status``, ``exit_code``, ``error``, ``stdout``, ``stderr``,
``violations`` or ``calls[N]``), how (`kind`), the recorded and replayed values as JSON values
(``None`` where there is none) and a sentence. Kinds:

- ``changed``: both have it and it differs;
- ``missing``: the recording has this call and the replay did not make it;
- ``unmatched``: the replay made a call the recording has no call of (same tool and arguments)
  to answer it with; the script was refused, nothing was invented;
- ``reordered``: the call was matched, but at another place in the sequence;
- ``inexact``: the record kept a marker instead of the call's result or error (the call log's
  `call_log_bytes` budget), so this call could not be answered as it was.

It stands beside `result.py` rather than in `sandbox/replay/`, which runs the engine: the codec
and the client read and return a report without importing what makes one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sandbox.result import ExecutionResult

__all__ = ["KINDS", "Difference", "ReplayReport"]

KINDS = ("changed", "missing", "unmatched", "reordered", "inexact")


@dataclass(frozen=True)
class Difference:
    what: str
    kind: str
    recorded: Any
    replayed: Any
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "kind": self.kind,
            "recorded": self.recorded,
            "replayed": self.replayed,
            "detail": self.detail,
        }


@dataclass
class ReplayReport:
    """The replay of ``execution_id``: its own result (``result.execution_id`` is the replay's
    record) and every difference from the recording; identical when there is none."""

    execution_id: str
    result: ExecutionResult
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    def to_json(self) -> dict[str, Any]:
        return {
            "execution_id": self.execution_id,
            "replay_execution_id": self.result.execution_id,
            "identical": self.identical,
            "differences": [d.to_json() for d in self.differences],
            "result": self.result.to_json(),
        }
