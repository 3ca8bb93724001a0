"""What one execution produced: status, output, the call log, violations, usage.

These dataclasses are the single in-memory form of a result. `to_json` renders the
`ptc run --json` contract of DESIGN.md (and `from_json` reads it back, as the audit store keeps
it); `sandbox.codec.result` converts the same objects to protobuf.
Violation precedence, when several limits trip at once, is fixed by `VIOLATION_ORDER`: the one
listed first explains the status (a wall-time kill is reported before the stdout truncation that
preceded it, a memory kill before a cpu overrun it caused).

A violation is evidence, never a claim: its ``observed`` is a measurement or ``None``, and its
``evidence`` (`Evidence`) says who measured it. The guest's own report of an error is output;
it becomes a violation only where the host corroborated it, or, for the refusals only the
sandbox can see (EMFILE; MemoryError or EFBIG where the host has no counter), marked ``guest``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.files import FileDigest, OmittedOutput, OutputFile
from sandbox.limits import LimitAdjustment, ResolvedLimits, fields_json

__all__ = [
    "VIOLATION_ORDER",
    "CallRecord",
    "CallStatus",
    "Evidence",
    "ExecutionResult",
    "ExecutionStatus",
    "ScriptError",
    "SessionEnd",
    "SessionEndState",
    "Usage",
    "Violation",
]


class ExecutionStatus(enum.StrEnum):
    OK = "ok"
    ERROR = "error"
    LIMIT_EXCEEDED = "limit_exceeded"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    FAILED = "failed"  # the service failed after admitting it; `error` names why


class CallStatus(enum.StrEnum):
    OK = "ok"
    ERROR = "error"
    INVALID_ARGUMENTS = "invalid_arguments"
    REFUSED = "refused"
    DENIED = "denied"
    CANCELLED = "cancelled"


@dataclass
class CallRecord:
    """One tool call as the broker saw it. ``tool`` is always the original name."""

    seq: int
    tool: str
    arguments: Any
    status: CallStatus = CallStatus.CANCELLED
    result: Any = None
    error: str | None = None
    start_offset_s: float = 0.0
    duration_s: float = 0.0
    idempotency_key: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "tool": self.tool,
            "arguments": self.arguments,
            "status": str(self.status),
            "start_offset_s": round(self.start_offset_s, 6),
            "duration_s": round(self.duration_s, 6),
            "idempotency_key": self.idempotency_key,
        }
        if self.status == CallStatus.OK:
            out["result"] = self.result
        else:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        """`to_json`'s inverse (records written before idempotency keys have none)."""
        return cls(
            seq=int(data["seq"]),
            tool=data["tool"],
            arguments=data["arguments"],
            status=CallStatus(data["status"]),
            result=data.get("result"),
            error=data.get("error"),
            start_offset_s=float(data["start_offset_s"]),
            duration_s=float(data["duration_s"]),
            idempotency_key=data.get("idempotency_key", ""),
        )


VIOLATION_ORDER = (
    "protocol",
    "wall_time",
    "memory",
    "cpu_time",
    "processes",
    "file_size",
    "open_files",
    "max_tool_calls",
    "call_log_bytes",
    "stdout_bytes",
    "stderr_bytes",
    "input_files",
    "input_bytes",
    "output_files",
    "output_file_bytes",
    "output_bytes",
    "expected_calls",
)


class Evidence(enum.StrEnum):
    """Where a violation's observation came from.

    ``kernel``: a kernel counter or event (cgroup memory failcnt and OOM kills, pids.events,
    CPU usage) or the exit status the kernel gave (SIGXCPU, SIGXFSZ). ``host``: the host's own
    measurement (its clock, the output capture's byte counts, the broker's call counts, the
    sandbox's tmpfs usage, a frame it could not parse). ``guest``: only the sandbox's report,
    where the host had no way to corroborate it. ``unspecified``: not recorded (audit records
    written before the field existed).
    """

    KERNEL = "kernel"
    HOST = "host"
    GUEST = "guest"
    UNSPECIFIED = "unspecified"


@dataclass(frozen=True)
class Violation:
    """A limit that tripped: its value and the measurement in ``unit``, and what was done.

    ``observed`` is what was measured, never the limit copied; ``None`` when nothing was (a
    refusal only the guest saw, a kernel event with no figure). ``action`` is ``killed``,
    ``truncated``, ``refused`` or ``reported`` (found after the end; nothing was stopped).
    """

    limit: str
    limit_value: float
    observed: float | None
    unit: str
    action: str  # killed | truncated | refused | reported | interrupted (session kept)
    detail: str = ""
    evidence: Evidence = field(kw_only=True)

    def to_json(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "limit_value": self.limit_value,
            "observed": self.observed,
            "unit": self.unit,
            "action": self.action,
            "detail": self.detail,
            "evidence": str(self.evidence),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Violation:
        """`to_json`'s inverse; records written before violations carried their evidence say
        nothing of it."""
        names = ("limit", "limit_value", "observed", "unit", "action")
        limit, limit_value, observed, unit, action = (data[name] for name in names)
        evidence = Evidence(data.get("evidence", Evidence.UNSPECIFIED))
        return cls(
            limit, limit_value, observed, unit, action, data.get("detail", ""), evidence=evidence
        )


@dataclass
class Usage:
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    peak_memory_bytes: int = 0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    tool_calls: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_time_s": round(self.wall_time_s, 6),
            "cpu_time_s": round(self.cpu_time_s, 6),
            "peak_memory_bytes": self.peak_memory_bytes,
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "tool_calls": self.tool_calls,
        }


@dataclass(frozen=True)
class ScriptError:
    type: str
    message: str
    line: int = 0  # 0: not known (a killed script, a service failure)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "line": self.line}

    def where(self) -> str:
        """`` (line N)`` for messages when the line is known, else nothing."""
        return f" (line {self.line})" if self.line > 0 else ""


class SessionEndState(enum.StrEnum):
    """How a session ended (`sandbox.sessions.SessionState`, but for ``active``)."""

    CLOSED = "closed"
    EXPIRED = "expired"
    LOST = "lost"


@dataclass(frozen=True)
class SessionEnd:
    """How a session ended, on its own record's completion: read by the store as it is
    (`sandbox.audit._sessions`), where its error's message says the same in words."""

    state: SessionEndState
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"state": str(self.state), "reason": self.reason}

    @classmethod
    def from_json(cls, data: object) -> SessionEnd | None:
        """`to_json`'s inverse; None on every record but a session's own, and on a session's
        record written before its end was typed (its end is then in its error's message alone)."""
        if not isinstance(data, Mapping):
            return None
        return cls(SessionEndState(data["state"]), str(data["reason"]))


@dataclass
class ExecutionResult:
    execution_id: str
    status: ExecutionStatus
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    calls: list[CallRecord] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    error: ScriptError | None = None
    backend: str = "process"
    isolation: list[str] = field(default_factory=list)
    # The limits applied; None before they are resolved, and on a record written before every
    # limit was recorded by field (`ResolvedLimits.from_record`).
    effective_limits: ResolvedLimits | None = None
    adjustments: list[LimitAdjustment] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0
    # Sessions (`sandbox.sessions`): the session it ran in, the repr of the cell's final bare
    # expression, and why the session ended if it ended during this execution.
    session_id: str = ""
    value: str | None = None
    session_lost: str = ""
    session_end: SessionEnd | None = None  # on a session's own record: how it ended
    # Files: the request's inputs by digest; what the script left under outputs/ (with its
    # bytes, except in an audit record); what it left there that was not returned, and why.
    input_files: list[FileDigest] = field(default_factory=list)
    output_files: list[OutputFile] = field(default_factory=list)
    omitted_outputs: list[OmittedOutput] = field(default_factory=list)

    def save_outputs(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Writes every returned output file under ``directory``; returns their paths."""
        return [output.save(directory) for output in self.output_files]

    def sort_violations(self) -> None:
        rank = {name: i for i, name in enumerate(VIOLATION_ORDER)}
        self.violations.sort(key=lambda v: rank.get(v.limit, len(rank)))

    def to_json(self, content: bool = True) -> dict[str, Any]:
        """The JSON contract; ``content=False`` leaves the output files' bytes out (their name,
        size and sha256 stay), as audit records keep them."""
        return {
            "execution_id": self.execution_id,
            "status": str(self.status),
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "calls": [c.to_json() for c in self.calls],
            "violations": [v.to_json() for v in self.violations],
            "usage": self.usage.to_json(),
            "error": self.error.to_json() if self.error else None,
            "backend": self.backend,
            "isolation": list(self.isolation),
            # By the proto's unit-named fields ({} for None): a documented output, and what the
            # audit chain hashed before the limits were typed, byte for byte.
            "limits": fields_json(self.effective_limits),
            "adjustments": [
                {
                    "limit": a.limit,
                    "requested": a.requested,
                    "applied": a.applied,
                    "action": a.action,
                }
                for a in self.adjustments
            ],
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "input_files": [f.to_json() for f in self.input_files],
            "output_files": [f.to_json(content) for f in self.output_files],
            "omitted_outputs": [o.to_json() for o in self.omitted_outputs],
            **self._session_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecutionResult:
        """`to_json`'s inverse, as an audit record keeps it (`to_json(content=False)`: output
        files without their bytes); records written before sessions or files have none."""
        error = data.get("error")
        return cls(
            execution_id=data["execution_id"],
            status=ExecutionStatus(data["status"]),
            exit_code=int(data["exit_code"]),
            stdout=data["stdout"],
            stderr=data["stderr"],
            calls=[CallRecord.from_json(c) for c in data["calls"]],
            violations=[Violation.from_json(v) for v in data["violations"]],
            usage=Usage(**data["usage"]),
            error=ScriptError(**error) if error else None,
            backend=data["backend"],
            isolation=list(data["isolation"]),
            effective_limits=ResolvedLimits.from_record(data["limits"], "result.limits"),
            adjustments=[LimitAdjustment(**a) for a in data["adjustments"]],
            started_at=float(data["started_at"]),
            finished_at=float(data["finished_at"]),
            session_id=str(data.get("session_id", "")),
            value=data.get("value"),
            session_lost=str(data.get("session_lost", "")),
            session_end=SessionEnd.from_json(data.get("session_end")),
            input_files=[FileDigest(**f) for f in data.get("input_files", [])],
            output_files=[OutputFile(**f) for f in data.get("output_files", [])],
            omitted_outputs=[OmittedOutput(**o) for o in data.get("omitted_outputs", [])],
        )

    def _session_json(self) -> dict[str, Any]:
        """Only for executions in a session: single-use results keep their exact shape."""
        if not self.session_id:
            return {}
        return {
            "session_id": self.session_id,
            "value": self.value,
            "session_lost": self.session_lost,
            # A session's own record alone: its cells keep their shape.
            **({"session_end": self.session_end.to_json()} if self.session_end else {}),
        }
