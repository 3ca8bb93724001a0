"""From what `sandbox.codec` decodes to what the server's parts take: a `Request` to the engine's
`ExecutionRequest` (the tenant's default policy filled in), an `ExecutionQuery` to the store's
`AuditQuery` (the default page size filled in). The codec has checked every field."""

from __future__ import annotations

from typing import Literal

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import AuditQuery
from sandbox.codec.query import DEFAULT_PAGE_SIZE, query_from_proto
from sandbox.codec.request import request_from_proto
from sandbox.engine import ExecutionRequest
from sandbox.limits import Limits

__all__ = ["audit_query", "execution_request"]

_NO_LIMITS = Limits()  # frozen: one for every request that sets none (building one costs ~5 us)


def execution_request(
    message: pb.ExecuteRequest, default_policy: Literal["none", "restricted"] = "none"
) -> ExecutionRequest:
    """The request as the engine takes it; the manifest stays JSON text, parsed by the engine."""
    request = request_from_proto(message)
    options = request.options
    return ExecutionRequest(
        script=request.script,
        manifest="[]" if request.manifest_json is None else request.manifest_json,
        limits=_NO_LIMITS if options.limits is None else options.limits,
        backend=options.backend,
        policy=options.policy or default_policy,
        expected_calls=options.expected_calls,
        labels=dict(options.labels) if options.labels else {},
        files=options.files,
        runtime=options.runtime,
        idempotency_key=options.idempotency_key or "",
    )


def audit_query(message: pb.ListExecutionsRequest) -> AuditQuery:
    query = query_from_proto(message)
    return AuditQuery(
        session_id=query.session_id or None,
        since=query.since,
        until=query.until,
        status=query.status,
        tool=query.tool,
        violation=query.violation,
        limit=query.page_size or DEFAULT_PAGE_SIZE,
        page_token=query.page_token or None,
    )
