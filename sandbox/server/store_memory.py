"""`MemoryAuditStore`: the `AuditStore` protocol kept in memory, for tests and a server without
a database.

It keeps the protocol's semantics so that it can stand in for the durable stores: `admit` before
the script runs, `complete` after, `running` records turned `interrupted` by
`mark_interrupted`, per-tenant hash chains checked by `verify`. Chaining: each record's
``prev_hash`` is the previous admission's link hash of the same tenant, fixed at admission (so
that concurrent executions completing out of order do not break the chain); its
``record_hash`` covers the link and the final status and result.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import json
import secrets
import socket
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any

from sandbox.audit.base import (
    Admission,
    AuditQuery,
    AuditRecord,
    DeadServer,
    Holder,
    KeyTaken,
    Member,
    VerifyReport,
)
from sandbox.errors import InvalidArgument
from sandbox.limits import fields_json
from sandbox.result import ExecutionResult

__all__ = ["MemoryAuditStore"]

GENESIS = "0" * 64


@dataclass
class _Entry:
    seq: int
    admission: Admission
    prev_hash: str
    link_hash: str
    status: str = "running"
    result: ExecutionResult | None = None
    record_hash: str = ""


def _sha(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


_ADMISSION_FIELDS = tuple(f.name for f in fields(Admission))


def _admission_json(admission: Admission) -> str:
    # The text `dataclasses.asdict` gave, without its deep copy of every value (~110 us per
    # admission for what is a flat record but for its expected calls).
    data = {name: getattr(admission, name) for name in _ADMISSION_FIELDS}
    data["effective_limits"] = fields_json(admission.effective_limits)
    data["labels"] = dict(admission.labels)
    if admission.expected_calls is not None:
        data["expected_calls"] = [asdict(item) for item in admission.expected_calls]
    return json.dumps(data, sort_keys=True, default=str)


def _result_json(result: ExecutionResult | None) -> str:
    return json.dumps(result.to_json() if result else None, sort_keys=True, default=str)


class MemoryAuditStore:
    quick_reads = True  # a dict look-up: no need for a worker thread (see `SQLiteAuditStore`)
    holds_sessions = False  # this process's memory: no other server can take a session over

    def __init__(self) -> None:
        self.instance = socket.gethostname()
        self._secret = secrets.token_urlsafe(32)
        self._entries: dict[str, _Entry] = {}
        self._heads: dict[str, str] = {}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str], str] = {}  # (tenant, idempotency key) -> execution

    def admit(self, admission: Admission) -> None:
        with self._lock:
            if admission.execution_id in self._entries:
                raise InvalidArgument(f"execution {admission.execution_id} was already admitted")
            if admission.idempotency_key:
                slot = (admission.tenant, admission.idempotency_key)
                if slot in self._keys:
                    raise KeyTaken(admission.idempotency_key, self._keys[slot])
                self._keys[slot] = admission.execution_id
            prev = self._heads.get(admission.tenant, GENESIS)
            link = _sha(prev, _admission_json(admission))
            entry = _Entry(next(self._seq), admission, prev, link)
            entry.record_hash = self._hash(entry)
            self._entries[admission.execution_id] = entry
            self._heads[admission.tenant] = link

    def by_key(self, tenant: str, key: str) -> str | None:
        with self._lock:
            return self._keys.get((tenant, key))

    def complete(self, execution_id: str, result: ExecutionResult) -> None:
        with self._lock:
            entry = self._entries.get(execution_id)
            if entry is None:
                raise InvalidArgument(f"execution {execution_id} was never admitted")
            entry.result = result
            entry.status = str(result.status)
            entry.record_hash = self._hash(entry)

    @staticmethod
    def _hash(entry: _Entry) -> str:
        return _sha(entry.link_hash, entry.status, _result_json(entry.result))

    @staticmethod
    def _record(entry: _Entry) -> AuditRecord:
        return AuditRecord(
            admission=entry.admission,
            result=entry.result,
            status=entry.status,
            prev_hash=entry.prev_hash,
            record_hash=entry.record_hash,
            script_sha256=hashlib.sha256(
                entry.admission.script.encode("utf-8", "surrogatepass")
            ).hexdigest(),
        )

    def get(self, tenant: str, execution_id: str) -> AuditRecord | None:
        with self._lock:
            entry = self._entries.get(execution_id)
            if entry is None or entry.admission.tenant != tenant:
                return None
            return self._record(entry)

    def list(self, tenant: str, query: AuditQuery) -> tuple[list[AuditRecord], str | None]:
        before: int | None = None
        if query.page_token:
            try:
                before = int(query.page_token)
            except ValueError:
                raise InvalidArgument("page_token: not a token this server issued") from None
        with self._lock:
            entries = sorted(
                (e for e in self._entries.values() if e.admission.tenant == tenant),
                key=lambda e: e.seq,
                reverse=True,
            )
            page: list[_Entry] = []
            more = False
            for entry in entries:
                if before is not None and entry.seq >= before:
                    continue
                if not _matches(entry, query):
                    continue
                if len(page) == query.limit:
                    more = True
                    break
                page.append(entry)
            token = str(page[-1].seq) if more and page else None
            return [self._record(e) for e in page], token

    def mark_interrupted(self) -> int:
        with self._lock:
            count = 0
            for entry in self._entries.values():
                if entry.status == "running":
                    entry.status = "interrupted"
                    entry.record_hash = self._hash(entry)
                    count += 1
            return count

    # One process's memory is no shared store: there is no fleet to join or to sweep.
    def heartbeat(self, address: str, ttl_s: float) -> None:
        return None

    def leave(self) -> None:
        return None

    def sweep_dead(self) -> builtins.list[DeadServer]:
        return []

    def holder(self, tenant: str, session_id: str) -> Holder | None:
        return None  # only this server: a session it does not hold is nowhere

    def members(self) -> builtins.list[Member]:
        return []

    def fleet_secret(self) -> str:
        return self._secret  # random, known to this process alone: no call can carry it

    def verify(self, tenant: str | None = None) -> VerifyReport:
        with self._lock:
            problems: list[str] = []
            heads: dict[str, str] = {}
            count = 0
            for entry in sorted(self._entries.values(), key=lambda e: e.seq):
                owner = entry.admission.tenant
                if tenant is not None and owner != tenant:
                    continue
                count += 1
                name = entry.admission.execution_id
                if entry.prev_hash != heads.get(owner, GENESIS):
                    problems.append(f"{name}: prev_hash does not match the previous record")
                if entry.link_hash != _sha(entry.prev_hash, _admission_json(entry.admission)):
                    problems.append(f"{name}: the admission was altered")
                if entry.record_hash != self._hash(entry):
                    problems.append(f"{name}: the result was altered")
                heads[owner] = entry.link_hash
            return VerifyReport(tenant, count, problems)

    def write_probe(self, pad_bytes: int = 0) -> None:
        """Memory always takes writes."""

    def schema_version(self) -> int:
        return 0  # no schema: nothing to migrate

    def find(self, execution_id: str) -> AuditRecord | None:
        with self._lock:
            entry = self._entries.get(execution_id)
            return None if entry is None else self._record(entry)

    def close(self) -> None:
        return None


def _matches(entry: _Entry, query: AuditQuery) -> bool:
    at = entry.admission.admitted_at
    if query.since is not None and at < query.since:
        return False
    if query.until is not None and at >= query.until:
        return False
    if query.status is not None and entry.status != query.status:
        return False
    result: Any = entry.result
    if query.tool is not None and (
        result is None or all(c.tool != query.tool for c in result.calls)
    ):
        return False
    return not (
        query.violation is not None
        and (result is None or all(v.limit != query.violation for v in result.violations))
    )
