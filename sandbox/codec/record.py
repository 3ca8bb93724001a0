"""`ExecutionRecord` <-> protobuf: one execution as the audit store holds it (the server encodes
an `AuditRecord`, the client decodes an `ExecutionRecord`), and a page of them.

A record whose execution has not ended carries what its admission knew (its id, backend,
effective limits and start) in a result with status UNSPECIFIED, which reads back as `RUNNING`
with no result; an interrupted one carries the same with status INTERRUPTED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.codec.limits import limits_to_proto, older_to_json_text
from sandbox.codec.result import result_from_proto, result_to_proto
from sandbox.codec.values import BACKEND_ENUM, timestamp
from sandbox.records import RUNNING, ExecutionPage, ExecutionRecord

if TYPE_CHECKING:  # only its fields are read: the client never loads the store
    from sandbox.audit.base import AuditRecord

__all__ = ["page_from_proto", "record_from_proto", "record_to_proto"]

# The fields the message and `ExecutionRecord` share by name, and where an `AuditRecord` keeps
# each: on the record itself, or on its admission.
_OF_RECORD = ("script_sha256", "prev_hash", "record_hash")
_OF_ADMISSION = ("tenant", "script", "manifest_sha256", "replay_of", "runtime", "idempotency_key")


def record_to_proto(record: AuditRecord) -> pb.ExecutionRecord:
    admission = record.admission
    if record.result is not None:
        result = result_to_proto(record.result)
    else:  # running or interrupted: what the admission knew
        result = pb.ExecutionResult(
            execution_id=admission.execution_id,
            status=pb.EXECUTION_STATUS_INTERRUPTED
            if record.status == "interrupted"
            else pb.EXECUTION_STATUS_UNSPECIFIED,
            backend=BACKEND_ENUM.get(admission.backend, pb.BACKEND_UNSPECIFIED),
            effective_limits=limits_to_proto(admission.effective_limits),
            older_limits_json=older_to_json_text(admission.older_limits),
            started_at=timestamp(admission.admitted_at),
        )
    shared: dict[str, Any] = {name: getattr(record, name) for name in _OF_RECORD}
    shared |= {name: getattr(admission, name) for name in _OF_ADMISSION}
    return pb.ExecutionRecord(
        result=result,
        labels=dict(admission.labels),
        interrupted_reason=record.interrupted_reason or "",
        **shared,
    )


def record_from_proto(message: pb.ExecutionRecord) -> ExecutionRecord:
    running = message.result.status == pb.EXECUTION_STATUS_UNSPECIFIED
    result = None if running else result_from_proto(message.result)
    return ExecutionRecord(
        execution_id=message.result.execution_id,
        status=RUNNING if result is None else str(result.status),
        result=result,
        labels=dict(message.labels),
        interrupted_reason=message.interrupted_reason,
        **{name: getattr(message, name) for name in (*_OF_RECORD, *_OF_ADMISSION)},
    )


def page_from_proto(message: pb.ListExecutionsResponse) -> ExecutionPage:
    return ExecutionPage([record_from_proto(r) for r in message.records], message.next_page_token)
