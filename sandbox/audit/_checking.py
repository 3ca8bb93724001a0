# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""What `verify` reads from the store: a tenant's entries and index rows, from the first entry
or from a signed checkpoint's.

From the first entry (or the prune checkpoint), every entry and index row of the tenant is read
in one snapshot and checked (`sandbox.audit._verify`). From a signed checkpoint of size ``n``
(``ptc audit verify --since-checkpoint``), whose entry ``n`` hash the caller has proven against
the checkpoint's root (`sandbox.audit.frontier`), only entries after ``n`` are read, linked to
that hash, and the index rows of the executions admitted after ``n``: the cost is what was
appended since. Entries after ``n`` of executions admitted before it (a completion, an
interruption, a take-over: each rewrote the execution's index rows after the checkpoint) are
checked as entries in order, and then those executions are read by id (their entries through
the ``entries_execution`` index, their rows by key) and their rows compared with what their
entries derive (`verify_late`): still the cost of what changed since. The text an admission
names by digest is checked against it (`sandbox.audit._contents.ContentCheck`): every row of
the tenant read once from the first entry, each row an entry names from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandbox.audit import _sessions
from sandbox.audit._codec import Entry
from sandbox.audit._contents import ContentCheck
from sandbox.audit._db import Tx
from sandbox.audit._index import CallRow, ExecRow, ViolationRow
from sandbox.audit._verify import ChainState, verify_late, verify_tenant

__all__ = ["ENTRY_COLUMNS", "EXEC_COLUMNS", "verify_in"]

ENTRY_COLUMNS = "tenant, seq, kind, execution_id, at_us, payload, prev_hash, entry_hash"
EXEC_COLUMNS = (
    "tenant, admit_seq, status, admitted_at, finished_at, backend, script_sha256, "
    "manifest_sha256, instance, prev_hash, record_hash, session_id"
)
_BATCH = 500


def verify_in(tx: Tx, tenant: str, since: tuple[int, str] | None) -> tuple[int, list[str]]:
    """(records seen, problems) of the tenant's chain, read in ``tx`` (one snapshot).
    ``since``: (n, hash of entry n) of a verified checkpoint to start after; None, or a prune
    checkpoint at or after it, starts from the beginning of what the store holds."""
    state = _chain_state(tx, tenant, since)
    if since is not None and state.checkpoint is not None and state.checkpoint[0] >= since[0]:
        since = None
        state = _chain_state(tx, tenant, None)
    after = since[0] if since is not None else 0
    state.contents = ContentCheck(tx, tenant, preload=since is None)
    entries = (
        _entry(r)
        for r in tx.stream(
            f"SELECT {ENTRY_COLUMNS} FROM entries WHERE tenant = ? AND seq > ? ORDER BY seq",
            (tenant, after),
        )
    )
    count, problems, late = verify_tenant(tenant, entries, state, since)
    if late:
        more, found = _verify_late(tx, tenant, sorted(late), after)
        count, problems = count + more, problems + found
    return count, problems


def _entry(r: tuple[Any, ...]) -> Entry:
    return Entry(
        str(r[0]), int(r[1]), str(r[2]), str(r[3]), int(r[4]), str(r[5]), str(r[6]), str(r[7])
    )


def _verify_late(tx: Tx, tenant: str, ids: list[str], after: int) -> tuple[int, list[str]]:
    """`verify_late` of ``ids``, read a batch at a time by id."""
    count, problems = 0, list[str]()
    for start in range(0, len(ids), _BATCH):
        chunk = ids[start : start + _BATCH]
        marks = ", ".join("?" for _ in chunk)
        state = ChainState(head=None, checkpoint=None)
        _rows(tx, state, f"tenant = ? AND execution_id IN ({marks})", [tenant, *chunk])
        _rows_of(tx, state, tenant, chunk)
        entries = [
            _entry(r)
            for r in tx.execute(
                f"SELECT {ENTRY_COLUMNS} FROM entries WHERE tenant = ? "
                f"AND execution_id IN ({marks}) ORDER BY seq",
                [tenant, *chunk],
            )
        ]
        seen, found = verify_late(tenant, entries, state, after)
        count, problems = count + seen, problems + found
    return count, problems


def _chain_state(tx: Tx, tenant: str, since: tuple[int, str] | None) -> ChainState:
    head = tx.execute("SELECT seq, head_hash FROM chain_heads WHERE tenant = ?", (tenant,))
    checkpoint = tx.execute("SELECT seq, entry_hash FROM checkpoints WHERE tenant = ?", (tenant,))
    state = ChainState(
        head=(int(head[0][0]), str(head[0][1])) if head else None,
        checkpoint=(int(checkpoint[0][0]), str(checkpoint[0][1])) if checkpoint else None,
    )
    where, params = (
        ("tenant = ?", [tenant])
        if since is None
        else (
            "tenant = ? AND admit_seq > ?",
            [tenant, since[0]],
        )
    )
    _rows(tx, state, where, params)
    if since is None:
        _lists(tx, state, "tenant = ?", [tenant])
        for row in tx.stream(_sessions.SELECT_TENANT, (tenant,)):
            found = _sessions.read_row([row])
            if found is not None:
                state.sessions[found.session_id] = found
        return state
    ids = sorted(state.rows)
    for start in range(0, len(ids), _BATCH):
        _rows_of(tx, state, tenant, ids[start : start + _BATCH])
    return state


def _rows(tx: Tx, state: ChainState, where: str, params: Sequence[object]) -> None:
    """The ``executions`` rows ``where`` selects, into ``state``."""
    for row in tx.stream(
        f"SELECT execution_id, {EXEC_COLUMNS} FROM executions WHERE {where}", params
    ):
        state.rows[str(row[0])] = ExecRow(
            str(row[1]),
            int(row[2]),
            str(row[3]),
            float(row[4]),
            None if row[5] is None else float(row[5]),
            str(row[6]),
            str(row[7]),
            str(row[8]),
            str(row[9]),
            str(row[10]),
            str(row[11]),
            None if row[12] is None else str(row[12]),
        )


def _rows_of(tx: Tx, state: ChainState, tenant: str, chunk: list[str]) -> None:
    """The calls, violations and sessions rows of the executions ``chunk``, into ``state``."""
    marks = ", ".join("?" for _ in chunk)
    _lists(tx, state, f"execution_id IN ({marks})", chunk)
    for row in tx.execute(
        f"{_sessions.SELECT_TENANT} AND session_id IN ({marks})", [tenant, *chunk]
    ):
        found = _sessions.read_row([row])
        if found is not None:
            state.sessions[found.session_id] = found


def _lists(tx: Tx, state: ChainState, where: str, params: Sequence[object]) -> None:
    calls: dict[str, list[CallRow]] = state.calls
    for execution_id, idx, seq, tool, status, admit_seq in tx.stream(
        f"SELECT execution_id, idx, seq, tool, status, admit_seq FROM calls WHERE {where}", params
    ):
        calls.setdefault(str(execution_id), []).append((int(idx), int(seq), str(tool), str(status)))
        _file(state, str(execution_id), admit_seq)
    violations: dict[str, list[ViolationRow]] = state.violations
    for execution_id, idx, name, action, admit_seq in tx.stream(
        f"SELECT execution_id, idx, limit_name, action, admit_seq FROM violations WHERE {where}",
        params,
    ):
        violations.setdefault(str(execution_id), []).append((int(idx), str(name), str(action)))
        _file(state, str(execution_id), admit_seq)


def _file(state: ChainState, execution_id: str, admit_seq: object) -> None:
    """Notes a calls or violations row filed under another admission than its execution's
    (its ``admit_seq`` is what lists by tool and violation page by: an edit could hide it)."""
    row = state.rows.get(execution_id)
    if row is not None and admit_seq != row.admit_seq:
        state.misfiled.add(execution_id)
