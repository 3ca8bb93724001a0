"""The session RPCs (CreateSession, GetSession, ListSessions, CloseSession) and their
conversions; `sandbox.sessions.manager` does the work.

CreateSession's limits are the session's whole-sandbox limits under the tenant's ceilings (its
``cpu_time`` is the session's total CPU budget); the idle timeout and lifetime default to the
tenant's ceilings and are clamped (or refused, under the tenant's ``refuse`` policy) to them.
"""

from __future__ import annotations

import asyncio

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import AuditQuery, AuditStore, SessionRows
from sandbox.codec.limits import limits_from_proto
from sandbox.codec.session import session_to_proto
from sandbox.codec.values import BACKENDS
from sandbox.engine import check_runtime as engine_check_runtime
from sandbox.errors import InvalidArgument, InvalidLimits, NotFound, Unavailable
from sandbox.older_limits import limits_json
from sandbox.records import SessionInfo
from sandbox.records import SessionState as InfoState
from sandbox.request_caps import check_labels
from sandbox.server.runner import Runner
from sandbox.sessions.manager import Session, SessionSettings, check_allowed
from sandbox.tenants.base import Tenant
from sandbox.tenants.policy import check_backend, check_runtime, check_tool_modes, effective_limits

__all__ = [
    "close_session",
    "create_session",
    "get_session",
    "list_sessions",
    "merged",
    "session_info",
]

MAX_LISTED_CELLS = 10_000  # an ended session's cells listed by GetSession, newest kept


def _seconds(tenant: Tenant, request: pb.CreateSessionRequest, field: str, ceiling_s: int) -> float:
    if not request.HasField(field):
        return float(ceiling_s)
    value_ms = int(getattr(request, field))
    if value_ms == 0:
        raise InvalidArgument(f"{field}: must be above 0")
    if value_ms > ceiling_s * 1000:
        if tenant.ceiling_policy == "refuse":
            raise InvalidLimits(
                f"{field}: {value_ms} is above the tenant's ceiling of {ceiling_s * 1000}"
            )
        return float(ceiling_s)
    return value_ms / 1000


async def create_session(
    runner: Runner, tenant: Tenant, request: pb.CreateSessionRequest
) -> pb.SessionInfo:
    if runner.refusing is not None:  # the server is draining: no new sessions
        raise Unavailable(runner.refusing)
    check_allowed(tenant.sessions_allowed, tenant.id)
    if request.backend and request.backend not in BACKENDS:
        raise InvalidArgument(f"backend: unknown value {request.backend}")
    check_labels(request.labels)
    backend = runner.engine.backend(BACKENDS.get(request.backend)).name
    check_backend(tenant, backend)
    manifest_json = request.manifest.json if request.HasField("manifest") else "[]"
    manifest = runner.engine.manifest(manifest_json)
    for index, tool in enumerate(manifest.tools):
        if tool.options.mode == "client":
            raise InvalidArgument(
                f"manifest: tools[{index}] {tool.name!r}: 'client'-mode tools are not served in "
                "sessions yet"
            )
    check_tool_modes(tenant, [(tool.name, tool.options.mode) for tool in manifest.tools])
    runner.host.check(manifest)
    check_runtime(tenant, request.runtime, runner.runtimes.exists)
    runtime = engine_check_runtime(runner.engine.backend(backend), request.runtime)
    limits, _adjustments = effective_limits(tenant, limits_from_proto(request.limits))
    settings = SessionSettings(
        limits=limits,
        idle_timeout_s=_seconds(tenant, request, "idle_timeout_ms", tenant.session_idle_timeout_s),
        max_lifetime_s=_seconds(tenant, request, "max_lifetime_ms", tenant.session_max_lifetime_s),
        max_executions=request.max_executions,
    )
    runner.sessions.start()
    session = await runner.sessions.create(
        tenant.id,
        manifest=manifest,
        manifest_json=manifest_json,
        backend=backend,
        settings=settings,
        labels=dict(request.labels),
        max_sessions=tenant.max_sessions,
        runtime=runtime,
    )
    return session_to_proto(session_info(session))


async def get_session(
    runner: Runner, tenant: Tenant, request: pb.GetSessionRequest
) -> pb.SessionInfo:
    """The session as this server holds it; a session that ended on another server, or before
    this server restarted, as the store's session row says it ended (until retention prunes
    it); otherwise the manager's NOT_FOUND, which says why the session is gone."""
    try:
        return session_to_proto(session_info(runner.sessions.get(tenant.id, request.session_id)))
    except NotFound:
        store = runner.store
        if not isinstance(store, SessionRows):
            raise
        ended = await asyncio.to_thread(_ended_session, store, store, tenant.id, request.session_id)
        if ended is None:
            raise
        return ended


def _ended_session(
    store: AuditStore, rows: SessionRows, tenant: str, session_id: str
) -> pb.SessionInfo | None:
    row = rows.session(tenant, session_id)
    if row is None or not row.ended:
        return None  # open in the record: the manager's answer (rebuilt by its next cell)
    record = store.get(tenant, session_id)
    cells: list[str] = []
    token: str | None = None
    while len(cells) < MAX_LISTED_CELLS:
        page, token = store.list(tenant, AuditQuery(session_id=session_id, page_token=token))
        cells += [r.admission.execution_id for r in page]
        if token is None:
            break
    return session_to_proto(
        SessionInfo(
            session_id=row.session_id,
            state=InfoState(row.state),
            end_reason=row.end_reason,
            backend=row.backend,
            # Every limit the session ran under; none from a record in an older format.
            limits=limits_json(None if record is None else record.admission.effective_limits),
            idle_timeout_ms=row.idle_timeout_ms,
            max_lifetime_ms=row.max_lifetime_ms,
            max_executions=row.max_executions,
            execution_ids=list(reversed(cells[:MAX_LISTED_CELLS])),  # oldest first
            created_at=row.created_at,
            last_used_at=row.ended_at or 0.0,
            ended_at=row.ended_at,
            isolation=[] if record is None or record.result is None else record.result.isolation,
            runtime=row.runtime,
        )
    )


def list_sessions(
    runner: Runner, tenant: Tenant, request: pb.ListSessionsRequest
) -> pb.ListSessionsResponse:
    found = runner.sessions.list(tenant.id, include_ended=request.include_ended)
    return pb.ListSessionsResponse(sessions=[session_to_proto(session_info(s)) for s in found])


def merged(
    local: pb.ListSessionsResponse, elsewhere: list[pb.SessionInfo]
) -> pb.ListSessionsResponse:
    """This server's sessions and the other servers', newest first, each once."""
    by_id = {info.session_id: info for info in elsewhere}
    by_id.update({info.session_id: info for info in local.sessions})  # the local view wins
    ordered = sorted(by_id.values(), key=lambda i: i.created_at.ToNanoseconds(), reverse=True)
    return pb.ListSessionsResponse(sessions=ordered)


async def close_session(
    runner: Runner, tenant: Tenant, request: pb.CloseSessionRequest
) -> pb.SessionInfo:
    return session_to_proto(
        session_info(await runner.sessions.close(tenant.id, request.session_id))
    )


def session_info(session: Session) -> SessionInfo:
    """A live session as the client reads it; its limits are the whole-sandbox ones."""
    limits = session.settings.limits
    return SessionInfo(
        session_id=session.id,
        state=InfoState(session.state),
        end_reason=session.reason,
        backend=session.backend,
        limits={
            "cpu_time_ms": limits.cpu_time_ms,
            "memory_bytes": limits.memory_bytes,
            "processes": limits.processes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        },
        idle_timeout_ms=round(session.settings.idle_timeout_s * 1000),
        max_lifetime_ms=round(session.settings.max_lifetime_s * 1000),
        max_executions=session.settings.max_executions,
        execution_ids=list(session.executions),
        running_execution_id=session.running or "",
        created_at=session.created_at,
        last_used_at=session.last_used_at,
        ended_at=session.ended_at,
        isolation=session.sandbox.isolation,
        runtime=session.runtime or "",
    )
