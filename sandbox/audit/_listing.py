# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""A page of a tenant's executions, newest first, each filter answered by an index.

Pages are in admission order (``admit_seq``, descending) and a page token is the last
``admit_seq`` served, so every page is a walk of an index from that point that stops once the
page is full: its cost is the page's, whatever the tenant's history.

- no filter, a status, a session: the ``executions`` indexes ``(tenant, admit_seq)``,
  ``(tenant, status, admit_seq)`` and ``(tenant, session_id, admit_seq)``;
- a tool or a violation: the ``calls`` or ``violations`` index ``(tenant, tool | limit_name,
  admit_seq)`` is walked in page order, a batch at a time, and each batch's executions are
  looked up by ``(tenant, admit_seq)`` with the other filters applied; both at once: the tool
  drives and the violation is an ``EXISTS`` on the ``violations`` primary key.

The old way, ``execution_id IN (SELECT ... FROM calls ...)``, built the whole set of matching
ids before the first row of the page (126 ms at a million executions on SQLite), and a
session's cells were a ``LIKE`` over the JSON of every admission (seconds).
"""

from __future__ import annotations

from typing import Any

from sandbox.audit._db import Tx
from sandbox.audit.base import AuditQuery
from sandbox.errors import InvalidArgument, quote

__all__ = ["MAX_PAGE", "page", "page_size", "parse_token"]

MAX_PAGE = 1000
_MAX_BATCH = 4000


def page_size(query: AuditQuery) -> int:
    return max(1, min(query.limit or 50, MAX_PAGE))


def parse_token(token: str) -> int:
    """The ``admit_seq`` a page token names. A token this store issued is "a" and a number: a
    few digits, never thousands (which int() would refuse with a ValueError)."""
    if not token.startswith("a") or not token[1:].isdigit() or len(token) > 24:
        raise InvalidArgument(f"page_token: {quote(token)} is not a token this store issued")
    return int(token[1:])


def _filters(tenant: str, query: AuditQuery, driven: bool) -> tuple[list[str], list[object]]:
    """The ``executions`` conditions besides the page position. ``driven``: the tool (or,
    without one, the violation) is the driving index's, not a condition here."""
    where: list[str] = ["tenant = ?"]
    params: list[object] = [tenant]
    if query.since is not None:
        where.append("admitted_at >= ?")
        params.append(query.since)
    if query.until is not None:
        where.append("admitted_at < ?")
        params.append(query.until)
    if query.status:
        where.append("status = ?")
        params.append(query.status)
    if query.session_id:
        where.append("session_id = ?")
        params.append(query.session_id)
    if query.violation and (query.tool or not driven):
        where.append(
            "EXISTS (SELECT 1 FROM violations v WHERE v.execution_id = executions.execution_id "
            "AND v.limit_name = ?)"
        )
        params.append(query.violation)
    if query.tool and not driven:
        where.append(
            "EXISTS (SELECT 1 FROM calls c WHERE c.execution_id = executions.execution_id "
            "AND c.tool = ?)"
        )
        params.append(query.tool)
    return where, params


def page(tx: Tx, tenant: str, query: AuditQuery) -> list[tuple[str, int]]:
    """Up to `page_size` + 1 (execution id, admit_seq) pairs, newest first: the extra one says
    that another page follows."""
    want = page_size(query) + 1
    before = parse_token(query.page_token) if query.page_token else None
    if not query.tool and not query.violation:
        where, params = _filters(tenant, query, driven=False)
        if before is not None:
            where.append("admit_seq < ?")
            params.append(before)
        return [
            (str(r[0]), int(r[1]))
            for r in tx.execute(
                f"SELECT execution_id, admit_seq FROM executions WHERE {' AND '.join(where)} "
                f"ORDER BY admit_seq DESC LIMIT {want}",
                params,
            )
        ]
    table, column, value = (
        ("calls", "tool", query.tool)
        if query.tool
        else ("violations", "limit_name", query.violation)
    )
    where, params = _filters(tenant, query, driven=True)
    found: list[tuple[str, int]] = []
    batch = want
    while len(found) < want:
        drive = f"SELECT admit_seq FROM {table} WHERE tenant = ? AND {column} = ?"
        drive_params: list[object] = [tenant, value]
        if before is not None:
            drive += " AND admit_seq < ?"
            drive_params.append(before)
        seqs = [
            int(r[0])
            for r in tx.execute(f"{drive} ORDER BY admit_seq DESC LIMIT {batch}", drive_params)
        ]
        if not seqs:
            break
        # An execution that called the tool n times has n rows: one look-up for each. A batch
        # that ends inside one execution's rows already took that execution.
        distinct = sorted(set(seqs), reverse=True)
        marks = ", ".join("?" for _ in distinct)
        rows: list[tuple[Any, ...]] = tx.execute(
            f"SELECT execution_id, admit_seq FROM executions WHERE {' AND '.join(where)} "
            f"AND admit_seq IN ({marks})",
            [*params, *distinct],
        )
        found += sorted(((str(r[0]), int(r[1])) for r in rows), key=lambda r: -r[1])
        if len(seqs) < batch:
            break
        before = seqs[-1]
        batch = min(batch * 2, _MAX_BATCH)
    return found[:want]
