"""JSON-lines export of audit records, newest first, one complete record per line.

Each line carries the admission (script included), the status, the result with every call and
violation, and the record's chain hashes, so an exported file can be archived or loaded into
other tools. Export streams pages through the same tenant-scoped queries as the API, so memory
stays bounded by one page.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import IO, Any

from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.audit.base import AuditQuery, AuditRecord
from sandbox.limits import fields_json

__all__ = ["export_jsonl", "iter_records", "record_to_json"]


def record_to_json(record: AuditRecord) -> dict[str, Any]:
    admission = record.admission
    return {
        "execution_id": admission.execution_id,
        "tenant": admission.tenant,
        "status": record.status,
        "admitted_at": admission.admitted_at,
        "script": admission.script,
        "script_sha256": record.script_sha256,
        "manifest_sha256": admission.manifest_sha256,
        "manifest_json": admission.manifest_json,
        "backend": admission.backend,
        "policy": admission.policy,
        "effective_limits": fields_json(admission.effective_limits),
        "labels": dict(admission.labels),
        "result": record.result.to_json() if record.result else None,
        "prev_hash": record.prev_hash,
        "record_hash": record.record_hash,
        "expected_calls": None
        if admission.expected_calls is None
        else [dataclasses.asdict(e) for e in admission.expected_calls],
        "replay_of": admission.replay_of,
        "runtime": admission.runtime,
    }


def iter_records(store: SqlAuditStore, tenant: str, query: AuditQuery) -> Iterator[AuditRecord]:
    """Every record matching ``query`` (its limit is the page size), newest first."""
    page = dataclasses.replace(query, limit=1000, page_token=None)
    while True:
        records, token = store.list(tenant, page)
        yield from records
        if token is None:
            return
        page = dataclasses.replace(page, page_token=token)


def export_jsonl(store: SqlAuditStore, tenants: list[str], query: AuditQuery, out: IO[str]) -> int:
    """Writes every matching record of ``tenants`` as JSON lines; returns how many."""
    count = 0
    for tenant in tenants:
        for record in iter_records(store, tenant, query):
            out.write(json.dumps(record_to_json(record), ensure_ascii=False) + "\n")
            count += 1
    return count
