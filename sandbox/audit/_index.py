"""The query index derived from chain entries: one function used to write it and to check it.

`executions`, `calls` and `violations` rows exist so that queries by tenant, time, status, tool
and violation kind are indexed. They are never trusted on their own: `derive` computes them
from an execution's entries, the store writes exactly what `derive` returns (a completion writes
the part of it that its own payload sets, `ended`, which `derive` uses too), and `verify`
recomputes them and reports any row that differs (an index edited to hide or fake a record).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.request_caps import SESSION_LABEL

__all__ = ["CallRow", "ExecRow", "ViolationRow", "derive", "ended", "session_of"]

CallRow = tuple[int, int, str, str]  # idx (position), seq, tool, status
ViolationRow = tuple[int, str, str]  # idx, limit, action


@dataclass(frozen=True)
class ExecRow:
    """An `executions` row, minus its primary key."""

    tenant: str
    admit_seq: int
    status: str
    admitted_at: float
    finished_at: float | None
    backend: str
    script_sha256: str
    manifest_sha256: str
    instance: str
    prev_hash: str
    record_hash: str
    session_id: str | None = None  # the admission's ``ptc.session_id`` label: a session's cell


@dataclass(frozen=True)
class Derived:
    row: ExecRow
    calls: list[CallRow]
    violations: list[ViolationRow]


def derive(
    tenant: str,
    admit_seq: int,
    admission: Mapping[str, Any],
    admit_prev_hash: str,
    last_kind: str,
    last_hash: str,
    result: Mapping[str, Any] | None,
    holder: str | None = None,
) -> Derived:
    """The index rows for an execution whose latest entry is ``last_kind``.

    ``result`` is the payload of the latest ``completed`` entry, if any: a completion recorded
    after an ``interrupted`` entry (a late finish) still counts, and is what the record shows.
    ``holder`` is the instance named by the latest ``taken_over`` entry (a session another
    server rebuilt: `sandbox.sessions.rebuild`), which then holds it instead of the admitting
    one; a ``taken_over`` entry after an ``interrupted`` one makes the record `running` again.
    """
    calls: list[CallRow] = []
    violations: list[ViolationRow] = []
    finished_at: float | None = None
    if result is not None:
        status, finished_at, calls, violations = ended(result)
    elif last_kind == "interrupted":
        status = "interrupted"
    else:
        status = "running"
    row = ExecRow(
        tenant=tenant,
        admit_seq=admit_seq,
        status=status,
        admitted_at=float(admission["admitted_at"]),
        finished_at=finished_at,
        backend=str(admission["backend"]),
        script_sha256=str(admission["script_sha256"]),
        manifest_sha256=str(admission["manifest_sha256"]),
        instance=holder if holder is not None else str(admission.get("instance", "")),
        prev_hash=admit_prev_hash,
        record_hash=last_hash,
        session_id=session_of(admission),
    )
    return Derived(row, calls, violations)


def session_of(admission: Mapping[str, Any]) -> str | None:
    """The session an admission's labels name (its ``ptc.session_id``), None for none."""
    labels = admission.get("labels")
    session = labels.get(SESSION_LABEL) if isinstance(labels, Mapping) else None
    return session if isinstance(session, str) and session else None


def ended(result: Mapping[str, Any]) -> tuple[str, float, list[CallRow], list[ViolationRow]]:
    """What a ``completed`` entry's payload sets in the index: the row's status and
    ``finished_at``, and its calls and violations rows. The rest of the row (admission fields,
    holder) depends on the admission and take-over entries alone, never on a completion."""
    calls = [
        (i, int(c["seq"]), str(c["tool"]), str(c["status"])) for i, c in enumerate(result["calls"])
    ]
    violations = [
        (i, str(v["limit"]), str(v["action"])) for i, v in enumerate(result["violations"])
    ]
    return str(result["status"]), float(result["finished_at"]), calls, violations
