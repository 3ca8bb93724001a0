"""How audit records become bytes: canonical JSON, entry hashes, admissions and results (a
result is read back with `ExecutionResult.from_json`).

The hash chain is over immutable *entries*, never over mutable rows. An execution contributes
an ``admitted`` entry when it is admitted and a ``completed`` (or ``interrupted``) entry when it
ends; retention adds a ``pruned`` entry. Each entry's hash covers a canonical header (format
version, tenant, per-tenant sequence number, kind, execution id, time in microseconds, the
previous entry's hash) and the entry's canonical JSON payload, so editing any byte of an entry,
deleting one, or swapping two breaks the chain. Payloads are stored as the exact text that was
hashed, so verification never depends on a database re-serialising JSON the same way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from sandbox.audit.base import Admission
from sandbox.expectations import ExpectedCalls
from sandbox.limits import ResolvedLimits, fields_json
from sandbox.result import ExecutionResult

__all__ = [
    "ENTRY_VERSION",
    "OUTPUT_CAP_BYTES",
    "Entry",
    "admission_from_json",
    "admission_to_json",
    "canonical",
    "entry_hash",
    "result_to_json",
    "sha256_text",
]

ENTRY_VERSION = 1
OUTPUT_CAP_BYTES = 1024 * 1024  # per stream kept in the record; the rest is dropped with a marker
KINDS = ("admitted", "completed", "interrupted", "pruned")


# What `json.dumps` builds on every call with these arguments, built once: its `encode` is the
# same C encoder, so the text is the same (tests/audit/test_audit_codec_bytes.py holds it).
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical(value: object) -> str:
    """The one JSON spelling that is hashed: sorted keys, no spaces, no NaN."""
    return _CANONICAL.encode(value)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One immutable link of a tenant's chain, as stored."""

    tenant: str
    seq: int
    kind: str
    execution_id: str
    at_us: int
    payload: str
    prev_hash: str
    entry_hash: str

    def expected_hash(self) -> str:
        return entry_hash(
            self.tenant,
            self.seq,
            self.kind,
            self.execution_id,
            self.at_us,
            self.payload,
            self.prev_hash,
        )


def entry_hash(
    tenant: str, seq: int, kind: str, execution_id: str, at_us: int, payload: str, prev: str
) -> str:
    # The canonical JSON of {"v", "tenant", "seq", "kind", "execution_id", "at_us", "prev"},
    # spelled out in its sorted key order: each string as the canonical encoder writes it
    # (`encode_basestring` is its own, ensure_ascii=False), each integer in decimal. Two
    # appends per execution hash one, so the encoder's set-up and key sort are skipped.
    # `int.__repr__` is how the encoder spells an int, and refuses a float or a string.
    header = (
        f'{{"at_us":{int.__repr__(at_us)},"execution_id":{encode_basestring(execution_id)},'
        f'"kind":{encode_basestring(kind)},"prev":{encode_basestring(prev)},'
        f'"seq":{int.__repr__(seq)},"tenant":{encode_basestring(tenant)},'
        f'"v":{ENTRY_VERSION}}}'
    )
    return "sha256:" + sha256_text(header + "\n" + payload)


def admission_to_json(admission: Admission, admitted_at: float) -> dict[str, Any]:
    return {
        "execution_id": admission.execution_id,
        "tenant": admission.tenant,
        "script": admission.script,
        "script_sha256": sha256_text(admission.script),
        "manifest_json": admission.manifest_json,
        "manifest_sha256": admission.manifest_sha256,
        "backend": admission.backend,
        "policy": admission.policy,
        # Proto field names with canonical integers (ms, bytes): the text the chain hashed when
        # these were a dict, byte for byte. Records written before that carry limit names in
        # report units (seconds), kept as they were in their entries (read back as None).
        "effective_limits": fields_json(admission.effective_limits),
        "labels": dict(admission.labels),
        "admitted_at": admitted_at,
    } | _replay_fields(admission)


def _replay_fields(admission: Admission) -> dict[str, Any]:
    """The keys a replay needs, written only when known (records before them lack them)."""
    out: dict[str, Any] = {}
    if admission.expected_calls is not None:
        out["expected_calls"] = [
            {"tool": e.tool, "min": e.min, "max": e.max} for e in admission.expected_calls
        ]
    if admission.replay_of:
        out["replay_of"] = admission.replay_of
    if admission.runtime:  # absent for the standard library: older records hash as they did
        out["runtime"] = admission.runtime
    if admission.idempotency_key:  # absent without one, likewise
        out["idempotency_key"] = admission.idempotency_key
    return out


def admission_from_json(data: Mapping[str, Any]) -> Admission:
    return Admission(
        execution_id=data["execution_id"],
        tenant=data["tenant"],
        script=data["script"],
        manifest_json=data["manifest_json"],
        manifest_sha256=data["manifest_sha256"],
        backend=data["backend"],
        policy=data["policy"],
        effective_limits=ResolvedLimits.from_record(
            data["effective_limits"], "admission.effective_limits"
        ),
        labels=dict(data["labels"]),
        admitted_at=float(data["admitted_at"]),
        expected_calls=None
        if "expected_calls" not in data
        else tuple(ExpectedCalls(e["tool"], e["min"], e["max"]) for e in data["expected_calls"]),
        replay_of=str(data.get("replay_of", "")),
        runtime=str(data.get("runtime", "")),
        idempotency_key=str(data.get("idempotency_key", "")),
    )


def _cap(text: str, cap: int) -> str:
    raw = text.encode("utf-8", errors="surrogatepass")
    if len(raw) <= cap:
        return text
    kept = raw[:cap].decode("utf-8", errors="ignore")
    dropped = len(raw) - len(kept.encode("utf-8"))
    return f"{kept}\n[audit: {dropped} bytes dropped]"


def result_to_json(result: ExecutionResult, cap: int = OUTPUT_CAP_BYTES) -> dict[str, Any]:
    """The result as recorded: `ExecutionResult.to_json`, with stdout/stderr capped."""
    data = result.to_json(content=False)  # output files by name, size and sha256 only
    data["stdout"] = _cap(result.stdout, cap)
    data["stderr"] = _cap(result.stderr, cap)
    return data
