"""The `SandboxService` servicer: one method per RPC of proto/ptc/sandbox/v1/sandbox.proto.

Methods authenticate the caller through the tenancy, convert with `convert`, and delegate: runs go
through `Runner` (unary) or `StreamSession` (streamed); stubs through `stubs_gen`; records through
the audit store. A session call first asks `forwarding.Forwarder` whether a live server elsewhere
holds the session, and is carried there if so; ListSessions adds the other servers' sessions.
Errors are raised as `sandbox.errors` classes and mapped to statuses by
`interceptors.ErrorInterceptor`, never here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.audit.base import Holder, KeyTaken
from sandbox.codec.record import record_to_proto
from sandbox.codec.result import result_to_proto
from sandbox.engine import RunHooks
from sandbox.errors import InvalidArgument, NotFound, PtcError, quote
from sandbox.server import idempotency, sessions
from sandbox.server.boundary import authenticate, checked
from sandbox.server.convert import audit_query, execution_request
from sandbox.server.forwarding import Forwarder
from sandbox.server.replay import serve_replay
from sandbox.server.runner import Runner, rebuild_bounds
from sandbox.server.stream import StreamSession
from sandbox.sessions.cells import cell_request
from sandbox.telemetry.tracing import attached, extract_context, tracer
from sandbox.tenants.base import Tenant
from stubs_gen import render_compact

__all__ = ["SandboxServicer"]

Context = aio.ServicerContext[Any, Any]


class SandboxServicer(pb_grpc.SandboxServiceServicer):  # type: ignore[misc]
    def __init__(self, runner: Runner, forwarder: Forwarder | None = None) -> None:
        self.runner = runner
        self.forwarder = forwarder  # None: sessions are only ever this server's

    def _tenant(self, context: Context) -> Tenant:
        return authenticate(self.runner.tenancy, context.invocation_metadata())

    async def Execute(self, request: pb.ExecuteRequest, context: Context) -> pb.ExecutionResult:
        tenant = self._tenant(context)
        if holder := await self._holder(context, tenant, request.session_id):
            assert self.forwarder is not None
            carried: pb.ExecutionResult = await self.forwarder.unary(
                holder, "Execute", request, context
            )
            return carried
        execution = execution_request(request, tenant.script_policy)
        # A key already admitted, by any server: that execution's result, nothing run again.
        earlier = await idempotency.admitted(
            self.runner.store, tenant.id, execution.idempotency_key
        )
        if earlier is not None:
            return await self._keyed(tenant, request, earlier)
        session = None
        if request.session_id:
            session = await self.runner.sessions.resume(
                tenant.id,
                request.session_id,
                rebuild_bounds(tenant),
                admit=lambda: self.runner.tenancy.admit(tenant),
            )
            execution = cell_request(
                session, execution, manifest_given=request.HasField("manifest")
            )
        prepared = self.runner.prepare(tenant, execution, streamed=False, session=session)
        cancel = asyncio.Event()
        with attached(_trace_parent(context)):  # the run's task inherits the caller's trace
            run = self.runner.start(prepared, RunHooks(cancel=cancel))
        try:
            result = await asyncio.shield(run)
        except asyncio.CancelledError:  # deadline passed or the client went away
            # A call reset before its deadline, with an idempotency key, is one the caller will
            # ask for again by that key (nginx resets the call to this server when it gives up
            # at its read timeout): the run goes on to its end, within its own limits, so the
            # retry gets its result. The caller's own deadline, or no key: stop it.
            if not (execution.idempotency_key and _before_deadline(context)):
                cancel.set()
            raise
        except KeyTaken as taken:  # another server admitted the same key a moment before
            return await self._keyed(tenant, request, taken.execution_id)
        return result_to_proto(result)

    async def _keyed(
        self, tenant: Tenant, request: pb.ExecuteRequest, execution_id: str
    ) -> pb.ExecutionResult:
        return await idempotency.answer(
            self.runner.store, self.runner.engine, tenant.id, request, execution_id
        )

    async def ExecuteStream(
        self, request_iterator: AsyncIterator[pb.ClientMessage], context: Context
    ) -> None:
        # Reads and writes go through the context (see `StreamSession`), not the iterator.
        try:
            tenant = self._tenant(context)
        except PtcError:
            # Take the client's start message before refusing: a refusal that races the
            # client's first write reaches it as gRPC's "Internal error from Core" instead of
            # our status (seen with an unknown key, now and then).
            await context.read()
            raise
        first = checked(await context.read())
        start = first.start if isinstance(first, pb.ClientMessage) else None
        if start is not None and (holder := await self._holder(context, tenant, start.session_id)):
            assert self.forwarder is not None
            await self.forwarder.stream(holder, first, context)
            return
        with attached(_trace_parent(context)):
            await StreamSession(self.runner, tenant, context).serve(first)

    async def GenerateStubs(
        self, request: pb.GenerateStubsRequest, context: Context
    ) -> pb.GenerateStubsResponse:
        self._tenant(context)
        if not request.HasField("manifest"):
            raise InvalidArgument("manifest: is required")
        manifest = self.runner.engine.manifest(request.manifest.json)
        return pb.GenerateStubsResponse(
            module=self.runner.engine.stubs(manifest),
            compact=render_compact(manifest),
            names=dict(manifest.names),
            warnings=list(manifest.warnings),
            manifest_hash=manifest.sha256,
        )

    async def GetExecution(
        self, request: pb.GetExecutionRequest, context: Context
    ) -> pb.ExecutionRecord:
        tenant = self._tenant(context)
        if not request.execution_id:
            raise InvalidArgument("execution_id: is empty")
        record = self.runner.store.get(tenant.id, request.execution_id)
        if record is None:
            raise NotFound(f"execution_id: no execution {quote(request.execution_id)}")
        return record_to_proto(record)

    async def ListExecutions(
        self, request: pb.ListExecutionsRequest, context: Context
    ) -> pb.ListExecutionsResponse:
        tenant = self._tenant(context)
        records, token = self.runner.store.list(tenant.id, audit_query(request))
        return pb.ListExecutionsResponse(
            records=[record_to_proto(r) for r in records], next_page_token=token or ""
        )

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Context
    ) -> pb.SessionInfo:
        return await sessions.create_session(self.runner, self._tenant(context), request)

    async def GetSession(self, request: pb.GetSessionRequest, context: Context) -> pb.SessionInfo:
        tenant = self._tenant(context)
        if holder := await self._holder(context, tenant, request.session_id):
            assert self.forwarder is not None
            info: pb.SessionInfo = await self.forwarder.unary(
                holder, "GetSession", request, context
            )
            return info
        return await sessions.get_session(self.runner, tenant, request)

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        local = sessions.list_sessions(self.runner, self._tenant(context), request)
        if self.forwarder is None:
            return local
        elsewhere = await self.forwarder.list_elsewhere(request, context)
        return sessions.merged(local, elsewhere)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Context
    ) -> pb.SessionInfo:
        tenant = self._tenant(context)
        if holder := await self._holder(context, tenant, request.session_id):
            assert self.forwarder is not None
            info: pb.SessionInfo = await self.forwarder.unary(
                holder, "CloseSession", request, context
            )
            return info
        return await sessions.close_session(self.runner, tenant, request)

    async def _holder(self, context: Context, tenant: Tenant, session_id: str) -> Holder | None:
        """The live server elsewhere holding ``session_id``; None to answer here."""
        if self.forwarder is None or not session_id:
            return None
        return await self.forwarder.holder_of(context, tenant.id, session_id)

    async def Replay(self, request: pb.ReplayRequest, context: Context) -> pb.ReplayReport:
        return await serve_replay(self.runner, self._tenant(context), request)


def _before_deadline(context: Context) -> bool:
    """Whether the call ended with time left (a reset, a client gone), not at its deadline."""
    remaining = context.time_remaining()
    return remaining is None or remaining > 0.05


def _trace_parent(context: Context) -> Any:
    """The caller's W3C trace context (``traceparent`` metadata), when tracing is on."""
    if tracer() is None:  # off: no need to copy the call's metadata to look
        return None
    return extract_context(
        {str(k).lower(): str(v) for k, v in (context.invocation_metadata() or ())}
    )
