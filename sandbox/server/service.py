"""The `SandboxService` servicer: one method per RPC of proto/ptc/sandbox/v1/sandbox.proto.

Methods authenticate the caller through the tenancy, convert with `convert`, and delegate: runs go
through `Runner` (unary) or `StreamSession` (streamed); stubs through `stubs_gen`; records through
the audit store. Errors are raised as `sandbox.errors` classes and mapped to statuses by
`interceptors.ErrorInterceptor`, never here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.errors import InvalidArgument, NotFound, PtcError, quote
from sandbox.server import sessions
from sandbox.server.boundary import authenticate
from sandbox.server.convert import (
    query_from_proto,
    record_to_proto,
    request_from_proto,
    result_to_proto,
)
from sandbox.server.replay import serve_replay
from sandbox.server.runner import Runner, rebuild_bounds
from sandbox.server.stream import StreamSession
from sandbox.telemetry.tracing import attached, extract_context
from sandbox.tenants.base import Tenant
from stubs_gen import render_compact

__all__ = ["SandboxServicer"]

Context = aio.ServicerContext[Any, Any]


class SandboxServicer(pb_grpc.SandboxServiceServicer):  # type: ignore[misc]
    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def _tenant(self, context: Context) -> Tenant:
        return authenticate(self.runner.tenancy, context.invocation_metadata())

    async def Execute(self, request: pb.ExecuteRequest, context: Context) -> pb.ExecutionResult:
        tenant = self._tenant(context)
        execution = request_from_proto(request, tenant.script_policy)
        session = None
        if request.session_id:
            session = await self.runner.sessions.resume(
                tenant.id,
                request.session_id,
                rebuild_bounds(tenant),
                admit=lambda: self.runner.tenancy.admit(tenant),
            )
            execution = self.runner.sessions.request_for(
                session, execution, manifest_given=request.HasField("manifest")
            )
        prepared = self.runner.prepare(tenant, execution, streamed=False, session=session)
        cancel = asyncio.Event()
        with attached(_trace_parent(context)):  # the run's task inherits the caller's trace
            run = self.runner.start(prepared, cancel=cancel)
        try:
            result = await asyncio.shield(run)
        except asyncio.CancelledError:  # deadline passed or the client went away
            cancel.set()
            raise
        return result_to_proto(result)

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
        with attached(_trace_parent(context)):
            await StreamSession(self.runner, tenant, context).serve()

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
        records, token = self.runner.store.list(tenant.id, query_from_proto(request))
        return pb.ListExecutionsResponse(
            records=[record_to_proto(r) for r in records], next_page_token=token or ""
        )

    async def CreateSession(
        self, request: pb.CreateSessionRequest, context: Context
    ) -> pb.SessionInfo:
        return await sessions.create_session(self.runner, self._tenant(context), request)

    async def GetSession(self, request: pb.GetSessionRequest, context: Context) -> pb.SessionInfo:
        return sessions.get_session(self.runner, self._tenant(context), request)

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        return sessions.list_sessions(self.runner, self._tenant(context), request)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Context
    ) -> pb.SessionInfo:
        return await sessions.close_session(self.runner, self._tenant(context), request)

    async def Replay(self, request: pb.ReplayRequest, context: Context) -> pb.ReplayReport:
        return await serve_replay(self.runner, self._tenant(context), request)


def _trace_parent(context: Context) -> Any:
    """The caller's W3C trace context (``traceparent`` metadata), when tracing is on."""
    return extract_context(
        {str(k).lower(): str(v) for k, v in (context.invocation_metadata() or ())}
    )
