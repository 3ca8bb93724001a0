"""Verification of one tenant's chain: hashes, links, sequence, head, checkpoint and index.

Pure logic over what the store reads (entries in sequence order, the head and checkpoint rows,
the index rows), so SQLite and PostgreSQL are checked by the same code. It streams entries and
keeps only a small summary per execution, so 100,000 records verify in bounded memory.

What each tampering looks like:

- an edited entry: its recomputed hash differs from the stored one;
- a deleted entry: a gap in the sequence numbers, or the head pointing past the last entry;
- a reordered entry (swapped sequence numbers): a broken link and a hash mismatch;
- an edited, deleted or inserted index row: the row differs from what the entries derive;
- an edited or deleted ``contents`` row (a script or manifest an admission names by digest):
  the text no longer matches the digest the entry's hash covers, or is not there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.audit._codec import Entry
from sandbox.audit._contents import ContentCheck, references
from sandbox.audit._index import CallRow, ExecRow, ViolationRow, derive
from sandbox.audit._sessions import derive_row, end_of
from sandbox.audit.base import SessionRecord

__all__ = ["ChainState", "verify_late", "verify_tenant"]


@dataclass
class _Exec:
    admit_seq: int
    admission: dict[str, Any]
    admit_prev: str
    last_kind: str = "admitted"
    last_hash: str = ""
    result: dict[str, Any] | None = None
    holder: str | None = None  # the instance of the latest `taken_over` entry


@dataclass
class ChainState:
    """What the store read besides the entries."""

    head: tuple[int, str] | None
    checkpoint: tuple[int, str] | None
    rows: dict[str, ExecRow] = field(default_factory=dict)
    calls: dict[str, list[CallRow]] = field(default_factory=dict)
    violations: dict[str, list[ViolationRow]] = field(default_factory=dict)
    # Executions with a calls or violations row whose ``admit_seq`` is not the execution's.
    misfiled: set[str] = field(default_factory=set)
    sessions: dict[str, SessionRecord] = field(default_factory=dict)  # rows by session id
    contents: ContentCheck | None = None  # the text admissions name by digest


def _summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a result payload the index depends on (keeps memory small)."""
    summary = _index_summary(result)
    if result.get("session_id") and result.get("session_id") == result.get("execution_id"):
        # A session's own record: how it ended, which its ``sessions`` row holds.
        summary["session_end"] = (*end_of(result), float(result["finished_at"]))
    return summary


def _index_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "status": result["status"],
        "finished_at": result["finished_at"],
        "calls": [
            {"seq": c["seq"], "tool": c["tool"], "status": c["status"]} for c in result["calls"]
        ],
        "violations": [{"limit": v["limit"], "action": v["action"]} for v in result["violations"]],
    }


_ADMISSION_KEYS = (
    "admitted_at",
    "backend",
    "script_sha256",
    "manifest_sha256",
    "instance",
    "labels",
    "runtime",
    "execution_id",
)


def verify_tenant(
    tenant: str,
    entries: Iterable[Entry],
    state: ChainState,
    since: tuple[int, str] | None = None,
) -> tuple[int, list[str], set[str]]:
    """Returns (records seen, problems, late); each problem names the record and what is wrong.

    ``since``: the entries start after entry n, whose hash is given (proven by a signed
    checkpoint), and ``state`` holds the index rows of the executions admitted after it.
    Entries of executions admitted before it are checked here as entries; those executions
    are ``late``, whose index rows `verify_late` checks from their own entries."""
    problems: list[str] = []
    execs: dict[str, _Exec] = {}
    late: set[str] = set()
    start = since or state.checkpoint or (0, "")
    expect_seq, prev = start[0] + 1, start[1]
    last: Entry | None = None
    last_pruned: dict[str, Any] | None = None
    for entry in entries:
        where = f"record {entry.execution_id} (entry {entry.seq}, {entry.kind})"
        if entry.seq != expect_seq:
            problems.append(
                f"tenant {tenant}: entries {expect_seq}..{entry.seq - 1} are missing before "
                f"{where}: deleted"
            )
        elif entry.prev_hash != prev:
            problems.append(
                f"{where}: does not link to the previous entry: an entry was deleted, "
                "inserted or reordered"
            )
        if entry.expected_hash() != entry.entry_hash:
            problems.append(f"{where}: content does not match its hash: edited or reordered")
        prev, expect_seq, last = entry.entry_hash, entry.seq + 1, entry
        try:
            payload = json.loads(entry.payload)
        except ValueError:
            problems.append(f"{where}: payload is not JSON: edited")
            continue
        if not isinstance(payload, dict):
            problems.append(f"{where}: payload is not an object: edited")
            continue
        if (
            since is not None
            and entry.kind not in ("admitted", "pruned")
            and entry.execution_id not in execs
        ):
            late.add(entry.execution_id)  # admitted before the checkpoint
            continue
        _track(tenant, entry, payload, where, execs, problems)
        if entry.kind == "admitted":
            _check_contents(entry, payload, where, state.contents, problems)
        if entry.kind == "pruned":
            last_pruned = payload
    _check_end(tenant, last, state, start, last_pruned, problems)
    _check_index(execs, tenant, state, problems)
    return len(execs), problems, late


def verify_late(
    tenant: str, entries: Iterable[Entry], state: ChainState, since_seq: int
) -> tuple[int, list[str]]:
    """(records seen, problems) of the executions admitted before a verification's starting
    checkpoint (entry ``since_seq``) with entries after it: a completion, an interruption or a
    take-over that changed their index rows after the checkpoint was signed. ``entries`` are
    every entry of those executions in sequence order, read by their ids; ``state`` holds
    their index rows alone. The entries at or before ``since_seq`` are hash-checked here (the
    ones after it were, in order, by `verify_tenant`); each execution's rows are compared with
    what its entries derive, as a full verification does."""
    problems: list[str] = []
    execs: dict[str, _Exec] = {}
    for entry in entries:
        where = f"record {entry.execution_id} (entry {entry.seq}, {entry.kind})"
        if entry.seq <= since_seq and entry.expected_hash() != entry.entry_hash:
            problems.append(f"{where}: content does not match its hash: edited or reordered")
        try:
            payload = json.loads(entry.payload)
        except ValueError:
            if entry.seq <= since_seq:
                problems.append(f"{where}: payload is not JSON: edited")
            continue
        if isinstance(payload, dict):
            _track(tenant, entry, payload, where, execs, problems)
    _check_index(execs, tenant, state, problems)
    return len(execs), problems


def _track(
    tenant: str,
    entry: Entry,
    payload: dict[str, Any],
    where: str,
    execs: dict[str, _Exec],
    problems: list[str],
) -> None:
    if entry.kind == "pruned":
        return
    if entry.kind == "admitted":
        if entry.execution_id in execs:
            problems.append(f"{where}: admitted twice")
            return
        if payload.get("tenant") != tenant or payload.get("execution_id") != entry.execution_id:
            problems.append(f"{where}: admission names another tenant or execution: moved")
        try:
            admission = {key: payload.get(key, "") for key in _ADMISSION_KEYS}
            float(admission["admitted_at"])
        except (TypeError, ValueError):
            problems.append(f"{where}: admission is malformed: edited")
            return
        execs[entry.execution_id] = _Exec(entry.seq, admission, entry.prev_hash)
        execs[entry.execution_id].last_hash = entry.entry_hash
        return
    record = execs.get(entry.execution_id)
    if record is None:
        problems.append(f"{where}: has no admission before it: deleted or reordered")
        return
    if entry.kind == "completed":
        try:
            record.result = _summary(payload)
        except (KeyError, TypeError):
            problems.append(f"{where}: result is malformed: edited")
    elif entry.kind == "taken_over":
        holder = payload.get("instance")
        if not isinstance(holder, str):
            problems.append(f"{where}: take-over names no instance: edited")
        else:
            record.holder = holder
    elif entry.kind != "interrupted":
        problems.append(f"{where}: unknown entry kind: edited")
    record.last_kind, record.last_hash = entry.kind, entry.entry_hash


def _check_contents(
    entry: Entry,
    payload: Mapping[str, Any],
    where: str,
    contents: ContentCheck | None,
    problems: list[str],
) -> None:
    """The text an admission names by digest: there, and the text its digest fixes."""
    named = references(payload)
    if named is None:
        problems.append(f"{where}: its by_digest fields are malformed: edited")
        return
    for name, digest in named:
        found = contents.problem(name, digest, entry.seq) if contents else "unchecked"
        if found is not None:
            problems.append(f"{where}: {found}")


def _check_end(
    tenant: str,
    last: Entry | None,
    state: ChainState,
    start: tuple[int, str],
    last_pruned: Mapping[str, Any] | None,
    problems: list[str],
) -> None:
    end = (last.seq, last.entry_hash) if last else start
    if state.head is None:
        if last is not None:
            problems.append(f"tenant {tenant}: the chain has no head row: deleted")
    elif state.head != end:
        after = f"record {last.execution_id} (entry {last.seq})" if last else "the chain start"
        if state.head[0] > end[0]:
            problems.append(
                f"tenant {tenant}: entries {end[0] + 1}..{state.head[0]} after {after} are "
                "missing: deleted"
            )
        else:
            problems.append(f"tenant {tenant}: the chain head does not match {after}: edited")
    if state.checkpoint is not None and state.checkpoint[0] >= start[0]:
        expected = {"through_seq": state.checkpoint[0], "through_hash": state.checkpoint[1]}
        if last_pruned is None or any(last_pruned.get(k) != v for k, v in expected.items()):
            problems.append(
                f"tenant {tenant}: the checkpoint at entry {state.checkpoint[0]} is not the one "
                "the last pruned entry recorded: edited"
            )


def _check_index(
    execs: Mapping[str, _Exec], tenant: str, state: ChainState, problems: list[str]
) -> None:
    rows = dict(state.rows)
    for execution_id, record in execs.items():
        derived = derive(
            tenant,
            record.admit_seq,
            record.admission,
            record.admit_prev,
            record.last_kind,
            record.last_hash,
            record.result,
            record.holder,
        )
        row = rows.pop(execution_id, None)
        where = f"record {execution_id}"
        if row is None:
            problems.append(f"{where}: missing from the executions index: deleted")
            continue
        if row != derived.row:
            fields = [
                name
                for name in ExecRow.__dataclass_fields__
                if getattr(row, name) != getattr(derived.row, name)
            ]
            problems.append(
                f"{where}: executions index differs from the chain in {', '.join(fields)}: edited"
            )
        if sorted(state.calls.get(execution_id, [])) != sorted(derived.calls):
            problems.append(f"{where}: calls index differs from the chain: edited")
        if sorted(state.violations.get(execution_id, [])) != sorted(derived.violations):
            problems.append(f"{where}: violations index differs from the chain: edited")
        _check_session(tenant, execution_id, record, state, problems)
        if execution_id in state.misfiled:
            problems.append(
                f"{where}: calls or violations index filed under another admission: edited"
            )
    for execution_id in rows:
        problems.append(
            f"record {execution_id}: in the executions index but not in the chain: inserted, "
            "or its entries were deleted"
        )
    for session_id in state.sessions:
        problems.append(
            f"session {session_id}: in the sessions index but not in the chain: inserted, or "
            "its entries were deleted"
        )


def _check_session(
    tenant: str, execution_id: str, record: _Exec, state: ChainState, problems: list[str]
) -> None:
    """The ``sessions`` row of a session record against what its entries derive."""
    end = record.result.get("session_end") if record.result else None
    expected = derive_row(tenant, record.admission, record.holder, end)
    row = state.sessions.pop(execution_id, None)
    if expected is None and row is None:
        return
    where = f"session {execution_id}"
    if row is None:
        problems.append(f"{where}: missing from the sessions index: deleted")
    elif expected is None:
        problems.append(f"{where}: in the sessions index but not a session in the chain: edited")
    elif row != expected:
        fields = [
            name
            for name in SessionRecord.__dataclass_fields__
            if getattr(row, name) != getattr(expected, name)
        ]
        problems.append(
            f"{where}: sessions index differs from the chain in {', '.join(fields)}: edited"
        )
