# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""Sessions as typed rows: a session's settings, state, holder and end, without parsing labels.

A session's life is a record of the chain like any execution's (its admission carries the
``ptc.kind = session`` label and its settings as labels; its completion says how it ended:
`sandbox.sessions.manager`), and those entries stay as they are. The ``sessions`` row is
derived from them when they are written, in the same transaction: the admission inserts it
(state ``active``, the settings as numbers), a take-over moves its holder, and the completion
sets its final state (``closed``, ``expired`` or ``lost``), its reason and its end time. So any
server answers "what became of session S" with one primary-key read, after a restart or from
another server of the fleet, until retention prunes the session's record (and the row with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox.audit._db import Tx
from sandbox.audit.base import SessionRecord
from sandbox.request_caps import (
    IDLE_TIMEOUT_LABEL,
    KIND_LABEL,
    MAX_EXECUTIONS_LABEL,
    MAX_LIFETIME_LABEL,
)

__all__ = [
    "ENDED_STATES",
    "SELECT_ROW",
    "SELECT_TENANT",
    "derive_row",
    "end_of",
    "insert_row",
    "read_row",
    "record_end",
    "settings_of",
]

ENDED_STATES = ("closed", "expired", "lost")
_COLUMNS = (
    "tenant, session_id, state, end_reason, holder, backend, runtime, created_at, ended_at, "
    "idle_timeout_ms, max_lifetime_ms, max_executions"
)


def settings_of(labels: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(idle timeout ms, lifetime ms, max executions) of a session admission's labels; None
    when the admission is not a session's."""
    if labels.get(KIND_LABEL) != "session":
        return None

    def number(name: str) -> int:
        value = labels.get(name, "0")
        return int(value) if isinstance(value, str) and value.isdigit() else 0

    return (
        number(IDLE_TIMEOUT_LABEL),
        number(MAX_LIFETIME_LABEL),
        number(MAX_EXECUTIONS_LABEL),
    )


def end_of(result: Mapping[str, Any]) -> tuple[str, str]:
    """(state, reason) of a session record's completion: its typed ``session_end``
    (`sandbox.result.SessionEnd`). A record completed before the end was typed has it only
    as its error's message, ``"<state>: <reason>"``, read back as such: those entries cannot
    change, and the chain must still derive their rows."""
    end = result.get("session_end")
    if isinstance(end, Mapping) and end.get("state") in ENDED_STATES:
        return str(end["state"]), str(end.get("reason", ""))
    error = result.get("error")
    message = str(error.get("message", "")) if isinstance(error, Mapping) else ""
    state, _, reason = message.partition(": ")
    if state in ENDED_STATES:
        return state, reason
    return "lost", message or str(result.get("session_lost") or "it ended")


def insert_row(tx: Tx, tenant: str, data: Mapping[str, Any], instance: str) -> None:
    """The row of a session admission (``data``: its payload), if it is one."""
    labels = data.get("labels")
    settings = settings_of(labels) if isinstance(labels, Mapping) else None
    if settings is None:
        return
    tx.execute(
        f"INSERT INTO sessions ({_COLUMNS}) VALUES (?, ?, 'active', '', ?, ?, ?, ?, NULL, ?, ?, ?) "
        "ON CONFLICT (tenant, session_id) DO NOTHING",
        (
            tenant,
            str(data["execution_id"]),
            instance,
            str(data.get("backend", "")),
            str(data.get("runtime", "")),
            float(data["admitted_at"]),
            *settings,
        ),
    )


def record_end(tx: Tx, tenant: str, session_id: str, result: Mapping[str, Any]) -> None:
    state, reason = end_of(result)
    tx.execute(
        "UPDATE sessions SET state = ?, end_reason = ?, ended_at = ? "
        "WHERE tenant = ? AND session_id = ?",
        (state, reason, float(result["finished_at"]), tenant, session_id),
    )


def derive_row(
    tenant: str,
    admission: Mapping[str, Any],
    holder: str | None,
    end: tuple[str, str, float] | None,
) -> SessionRecord | None:
    """The row the store writes for a session record with this admission payload, latest
    take-over ``holder`` and ``end`` ((state, reason, finish time) of its completion): what
    `verify` compares the stored row with. None when the admission is not a session's."""
    labels = admission.get("labels")
    settings = settings_of(labels) if isinstance(labels, Mapping) else None
    if settings is None:
        return None
    return SessionRecord(
        tenant=tenant,
        session_id=str(admission.get("execution_id", "")),
        state=end[0] if end else "active",
        end_reason=end[1] if end else "",
        holder=holder if holder is not None else str(admission.get("instance", "")),
        backend=str(admission.get("backend", "")),
        runtime=str(admission.get("runtime", "")),
        created_at=float(admission["admitted_at"]),
        ended_at=end[2] if end else None,
        idle_timeout_ms=settings[0],
        max_lifetime_ms=settings[1],
        max_executions=settings[2],
    )


def read_row(rows: list[tuple[Any, ...]]) -> SessionRecord | None:
    if not rows:
        return None
    r = rows[0]
    return SessionRecord(
        tenant=str(r[0]),
        session_id=str(r[1]),
        state=str(r[2]),
        end_reason=str(r[3]),
        holder=str(r[4]),
        backend=str(r[5]),
        runtime=str(r[6]),
        created_at=float(r[7]),
        ended_at=None if r[8] is None else float(r[8]),
        idle_timeout_ms=int(r[9]),
        max_lifetime_ms=int(r[10]),
        max_executions=int(r[11]),
    )


SELECT_ROW = f"SELECT {_COLUMNS} FROM sessions WHERE tenant = ? AND session_id = ?"
SELECT_TENANT = f"SELECT {_COLUMNS} FROM sessions WHERE tenant = ?"
