"""`AsyncClient`: the asyncio client of the sandbox service.

    async with AsyncClient("127.0.0.1:50051") as client:
        result = await client.run(script, tools=[get_weather], on_output=print_chunk)

`run` streams (`ExecuteStream`): output arrives through ``on_output`` as it is produced, calls of
the client's own tools run here and their results flow back into the running script, and calls that
need approval are put to ``approve``. `start` returns the `Execution` itself
(`sandbox.client.execution`), which is also an async iterator of output chunks. `execute` is the
unary RPC for scripts whose tools all run on the server. Results are
`sandbox.result.ExecutionResult`, the same objects the embedded engine returns. A failing script is
a result; a refused request or an unreachable server raises the `sandbox.errors` class of its gRPC
status (`InvalidArgument`, `Unauthenticated`, `PermissionDenied`, `ResourceExhausted`,
`Unavailable`, ...) with the server's message. A server that stops answering (frozen, its host
hung, the path to it dropping packets) is noticed by HTTP/2 keepalive pings (`keepalive`,
`sandbox.keepalive`: on by default): every call on the connection then ends with `Unavailable`
saying that the server stopped answering keepalive pings, and within how long.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Unpack

import grpc
from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client._errors import error_from_status, translated
from sandbox.client._retry import Deadline, RetryPolicy, new_key, retryable, unknown_outcome
from sandbox.client.execution import (
    ApprovalRequest,
    Execution,
    OutputChunk,
    StreamCallbacks,
    StreamKeywords,
    split_keywords,
)
from sandbox.client.sessions import AsyncSession, SessionCalls
from sandbox.client.tls import PemLike, channel_credentials
from sandbox.client.tools import ClientTool, ToolLike, build_manifest
from sandbox.codec.limits import limits_to_proto
from sandbox.codec.query import query_to_proto
from sandbox.codec.record import page_from_proto, record_from_proto
from sandbox.codec.replay import report_from_proto
from sandbox.codec.request import Request, request_to_proto
from sandbox.codec.result import result_from_proto
from sandbox.codec.session import session_from_proto
from sandbox.codec.values import BACKEND_ENUM
from sandbox.errors import PtcError, Unavailable
from sandbox.keepalive import FAILURE, Keepalive
from sandbox.limits import CEILINGS
from sandbox.message_bounds import request_bytes_bound, result_bytes_bound
from sandbox.options import (
    LimitsLike,
    RunOptions,
    RunOverrides,
    SessionOptions,
    SessionOverrides,
)
from sandbox.records import ExecutionPage, ExecutionQuery, ExecutionRecord, SessionInfo
from sandbox.replay_report import ReplayReport
from sandbox.result import ExecutionResult
from sandbox.telemetry.progress import ProgressSnapshot as Progress
from sandbox.telemetry.tracing import inject_context

__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "Execution",
    "OutputChunk",
    "Progress",
    "RetryPolicy",
    "StreamCallbacks",
    "StreamKeywords",
    "Stubs",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stubs:
    module: str
    compact: str
    names: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    manifest_hash: str = ""


def _channel(
    target: str, credentials: grpc.ChannelCredentials | None, options: list[tuple[str, Any]]
) -> aio.Channel:
    if credentials is None:
        return aio.insecure_channel(target, options=options)
    return aio.secure_channel(target, credentials, options=options)


class AsyncClient:
    def __init__(
        self,
        target: str,
        api_key: str | None = None,
        *,
        options: Sequence[tuple[str, Any]] = (),
        tls_ca: PemLike | None = None,
        tls_cert: PemLike | None = None,
        tls_key: PemLike | None = None,
        retry: RetryPolicy | None = None,
        keepalive: Keepalive | None = None,
    ) -> None:
        """A client of the server at ``target``; with ``tls_ca`` (the CA bundle to trust) or a
        client certificate (``tls_cert`` and ``tls_key``, for mTLS), over TLS. Each is a PEM
        file's path or its bytes; TLS without ``tls_ca`` trusts the system's CAs. ``retry``
        bounds how often an execution whose outcome is unknown is asked for again by its
        idempotency key (`sandbox.client._retry`; ``RetryPolicy(attempts=1)``: never).
        ``keepalive`` (`Keepalive`; default ``Keepalive()``: a ping after 20 s without data,
        answered within 15 s) bounds how long a call waits on a server that stopped answering;
        ``Keepalive.OFF`` sends no pings. Raw ``options`` come last and win."""
        self.target = target
        self.retry = retry or RetryPolicy()
        self.keepalive = keepalive or Keepalive()
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        credentials = channel_credentials(tls_ca, tls_cert, tls_key)
        self._channel = _channel(
            target,
            credentials,
            [
                # Any result the server's limits allow (`result_bytes_bound`), with its request.
                (
                    "grpc.max_receive_message_length",
                    32 * 1024 * 1024 + result_bytes_bound(CEILINGS),
                ),
                # Any request the documented caps allow (checked before sending).
                ("grpc.max_send_message_length", request_bytes_bound(CEILINGS)),
                *self.keepalive.channel_options(),
                *options,
            ],
        )
        self._stub = pb_grpc.SandboxServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(None)

    async def start(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **keywords: Unpack[StreamKeywords],
    ) -> Execution:
        """Starts a streamed execution and returns it while it runs; with ``session_id``, as
        that session's next cell (its tools replaced by ``tools``, kept when ``tools`` is None).
        ``options`` (`RunOptions`) or the same names as keywords say how to run it; the
        `StreamCallbacks` are called as it runs."""
        chosen, callbacks = split_keywords(options, keywords)
        request, local = _execute_request(script, tools, chosen)
        request.idempotency_key = request.idempotency_key or new_key()
        return await self._open(request, local, chosen.timeout, callbacks)

    async def _open(
        self,
        request: pb.ExecuteRequest,
        local: Mapping[str, ClientTool],
        timeout: float | None,
        callbacks: StreamCallbacks,
    ) -> Execution:
        call = self._stub.ExecuteStream(metadata=self._call_metadata(), timeout=timeout)
        try:
            await call.write(pb.ClientMessage(start=request))
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            # The server may end the call before reading a byte (an unknown key): the write then
            # fails with a generic error, and the call's status says what really happened.
            code = await call.code()
            if code == grpc.StatusCode.OK:
                raise Unavailable(f"the server ended the stream at its start: {exc}") from exc
            details, trailing = await call.details(), await call.trailing_metadata()
            raise error_from_status(code, details, trailing, self.keepalive) from exc
        return Execution(call, local, callbacks, self.keepalive)

    async def run(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **keywords: Unpack[StreamKeywords],
    ) -> ExecutionResult:
        """Runs ``script`` to the end with the client in the loop; returns the result. A stream
        that fails with its outcome unknown (UNAVAILABLE, or INTERNAL/UNKNOWN from a balancer
        that reset it) is opened again with the same idempotency key, which asks for the
        execution instead of running it again (`sandbox.client._retry`)."""
        chosen, callbacks = split_keywords(options, keywords)
        request, local = _execute_request(script, tools, chosen)
        request.idempotency_key = request.idempotency_key or new_key()

        async def attempt(timeout: float | None) -> ExecutionResult:
            execution = await self._open(request, local, timeout, callbacks)
            return await execution.result()

        return await self._retrying(request.idempotency_key, chosen.timeout, attempt)

    async def _retrying(
        self,
        key: str,
        timeout: float | None,
        attempt: Callable[[float | None], Awaitable[ExecutionResult]],
    ) -> ExecutionResult:
        """``attempt`` until it returns, fails for good, or the policy's attempts or the call's
        ``timeout`` run out; each attempt gets what is left of ``timeout``."""
        deadline = Deadline(timeout)
        number = 0
        unanswered: PtcError | None = None  # the first attempt a keepalive ping ended
        while True:
            number += 1
            try:
                return await attempt(deadline.remaining())
            except PtcError as error:
                if not retryable(error):
                    raise
                if unanswered is None and error.message.startswith(FAILURE):
                    unanswered = error
                pause = self.retry.delay(number)
                if number >= self.retry.attempts or not deadline.allows(pause):
                    last = _last(error, unanswered, key, number)
                    raise last from last.__cause__
                log.info(
                    "execution with idempotency_key %s: attempt %d failed (%s); asking again",
                    key,
                    number,
                    error.message,
                )
                await asyncio.sleep(pause)

    async def execute(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **overrides: Unpack[RunOverrides],
    ) -> ExecutionResult:
        """The unary `Execute`: every tool must be served by the server (echo, mock, host)."""
        chosen = RunOptions.of(options, **overrides)
        request, local = _execute_request(script, tools, chosen)
        if local:
            raise ValueError("execute() cannot run client functions; use run()")
        request.idempotency_key = request.idempotency_key or new_key()

        async def attempt(timeout: float | None) -> ExecutionResult:
            async with translated(self.keepalive):
                message = await self._stub.Execute(
                    request, metadata=self._call_metadata(), timeout=timeout
                )
            return result_from_proto(message)

        return await self._retrying(request.idempotency_key, chosen.timeout, attempt)

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The key, and the caller's current trace context (W3C ``traceparent``) if any."""
        carrier: dict[str, str] = {}
        inject_context(carrier)
        return self._metadata + tuple(carrier.items()) if carrier else self._metadata

    async def stubs(self, tools: str | Sequence[ToolLike]) -> Stubs:
        """The stub module scripts import as `tools`, and its compact form for a prompt."""
        manifest, _local = build_manifest(tools)
        async with translated(self.keepalive):
            response = await self._stub.GenerateStubs(
                pb.GenerateStubsRequest(manifest=pb.ToolManifest(json=manifest)),
                metadata=self._metadata,
            )
        return Stubs(
            response.module,
            response.compact,
            dict(response.names),
            list(response.warnings),
            response.manifest_hash,
        )

    async def get_execution(self, execution_id: str) -> ExecutionRecord:
        """The audit record of one of this tenant's executions (`RUNNING` while it runs)."""
        async with translated(self.keepalive):
            record = await self._stub.GetExecution(
                pb.GetExecutionRequest(execution_id=execution_id), metadata=self._metadata
            )
        return record_from_proto(record)

    async def list_executions(self, query: ExecutionQuery | None = None) -> ExecutionPage:
        """One page of this tenant's records, newest first, filtered by ``query``."""
        async with translated(self.keepalive):
            response = await self._stub.ListExecutions(
                query_to_proto(query), metadata=self._metadata
            )
        return page_from_proto(response)

    def session(
        self,
        tools: str | Sequence[Mapping[str, Any]] = (),
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
        **overrides: Unpack[SessionOverrides],
    ) -> AsyncSession:
        """A session (`sandbox.client.sessions`): ``async with client.session(...) as s``.
        ``options`` (`SessionOptions`) or the same names as keywords: times in seconds;
        ``limits`` are the whole session's (``cpu_time`` its total CPU); every cell runs in
        ``runtime`` (`ptc runtime list`). With ``session_id`` it attaches to an existing
        session instead of creating one."""
        calls = SessionCalls(
            create=partial(self._session_call, self._stub.CreateSession),
            get=partial(self._session_call, self._stub.GetSession),
            close=partial(self._session_call, self._stub.CloseSession),
            execute=self.execute,
        )
        return AsyncSession(
            calls, tools, SessionOptions.of(options, **overrides), session_id=session_id
        )

    async def _session_call(
        self, method: Callable[..., Awaitable[pb.SessionInfo]], request: Any
    ) -> pb.SessionInfo:
        """A session RPC with the key, its failure translated here, where the keepalive that
        names an unanswered ping is known."""
        async with translated(self.keepalive):
            return await method(request, metadata=self._metadata)

    async def list_sessions(self, include_ended: bool = False) -> list[SessionInfo]:
        async with translated(self.keepalive):
            response = await self._stub.ListSessions(
                pb.ListSessionsRequest(include_ended=include_ended), metadata=self._metadata
            )
        return [session_from_proto(info) for info in response.sessions]

    async def replay(
        self,
        execution_id: str,
        *,
        tools: str | Sequence[ToolLike] | None = None,
        limits: LimitsLike = None,
        backend: str | None = None,
        timeout: float | None = None,
    ) -> ReplayReport:
        """Replays a recorded execution of this tenant on the server, every tool call answered
        from its record (`sandbox.replay`): against ``tools`` instead of the recorded manifest
        and ``limits`` over the recorded ones, when given. Returns what differs."""
        request = pb.ReplayRequest(execution_id=execution_id)
        if tools is not None:
            manifest, _local = build_manifest(tools)  # functions are never called by a replay
            request.manifest.json = manifest
        chosen = RunOptions.of(limits=limits, backend=backend)
        if chosen.limits is not None:
            request.limits.CopyFrom(limits_to_proto(chosen.limits))
        if chosen.backend is not None:
            request.backend = BACKEND_ENUM[chosen.backend]
        async with translated(self.keepalive):
            message = await self._stub.Replay(request, metadata=self._metadata, timeout=timeout)
        return report_from_proto(message)


def _last(error: PtcError, unanswered: PtcError | None, key: str, attempts: int) -> PtcError:
    """The error a call whose attempts ran out raises: its first keepalive failure if it had
    one (a server that froze, whose retries then only met a connection that never came up, is
    a server that stopped answering, which is what the caller needs to read), else the last."""
    chosen = error
    if unanswered is not None and unanswered is not error:
        chosen = unanswered
        chosen.add_note(f"the attempts after it failed too; the last: {error.message}")
    unknown_outcome(chosen, key, attempts)
    return chosen


def _execute_request(
    script: str, tools: str | Sequence[ToolLike] | None, options: RunOptions
) -> tuple[pb.ExecuteRequest, dict[str, ClientTool]]:
    """The request for ``script`` and the client's own functions among ``tools``; a session's
    cell given no ``tools`` (None) keeps the session's."""
    manifest, local = build_manifest(tools or ())
    keep = tools is None and bool(options.session_id)
    return request_to_proto(Request(script, None if keep else manifest, options)), local
