"""`AsyncClient`: the asyncio client of the sandbox service.

    async with AsyncClient("127.0.0.1:50051") as client:
        result = await client.run(script, tools=[get_weather], on_output=print_chunk)

`run` streams (`ExecuteStream`): output arrives through ``on_output`` as it is produced, calls of
the client's own tools run here and their results flow back into the running script, and calls
that need approval are put to ``approve``. `start` returns the `Execution` itself, which is also
an async iterator of output chunks. `execute` is the unary RPC for scripts whose tools all run on
the server. Results are `sandbox.result.ExecutionResult`, the same objects the embedded engine
returns. A failing script is a result; a refused request or an unreachable server raises the
`sandbox.errors` class of its gRPC status (`InvalidArgument`, `Unauthenticated`,
`PermissionDenied`, `ResourceExhausted`, `Unavailable`, ...) with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

import grpc
from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client._errors import error_from_rpc, error_from_status, translated
from sandbox.client._retry import Deadline, RetryPolicy, new_key, retryable, unknown_outcome
from sandbox.client.sessions import AsyncSession
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
from sandbox.limits import CEILINGS, request_bytes_bound, result_bytes_bound
from sandbox.options import (
    LimitsLike,
    RunOptions,
    RunOverrides,
    SessionOptions,
    SessionOverrides,
)
from sandbox.records import ExecutionPage, ExecutionQuery, ExecutionRecord, SessionInfo
from sandbox.replay.report import ReplayReport
from sandbox.result import ExecutionResult
from sandbox.telemetry.progress import ProgressSnapshot as Progress
from sandbox.telemetry.tracing import client_tool_context, inject_context

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
_STREAM_NAMES = {pb.STREAM_STDOUT: "stdout", pb.STREAM_STDERR: "stderr"}


@dataclass(frozen=True)
class OutputChunk:
    stream: str  # "stdout" | "stderr"
    data: bytes


@dataclass(frozen=True)
class ApprovalRequest:
    seq: int
    tool: str
    arguments: Any


@dataclass(frozen=True)
class Stubs:
    module: str
    compact: str
    names: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    manifest_hash: str = ""


# approve(request) -> bool | (bool, reason); sync or async.
Approve = Callable[
    [ApprovalRequest], "bool | tuple[bool, str] | Awaitable[bool | tuple[bool, str]]"
]
OnOutput = Callable[[OutputChunk], Any]
OnProgress = Callable[[Progress], Any]


class StreamCallbacks(TypedDict, total=False):
    """What a streamed execution calls back, each sync or async: ``on_output`` with every
    `OutputChunk` as it is produced, ``approve`` with every call that needs approval,
    ``on_progress`` with a `Progress` about once a second once a run is past a second."""

    on_output: OnOutput | None
    approve: Approve | None
    on_progress: OnProgress | None


class StreamKeywords(RunOverrides, StreamCallbacks, total=False):
    """The keyword arguments of a streamed run (`run`, `start`, `stream`): `RunOptions`' fields
    and the `StreamCallbacks`, written once for the sync and the asyncio client."""


def split_keywords(
    options: RunOptions | None, keywords: StreamKeywords
) -> tuple[RunOptions, StreamCallbacks]:
    """``options`` with ``keywords``' `RunOptions` fields over it, and the callbacks."""
    callbacks = StreamCallbacks(
        on_output=keywords.pop("on_output", None),
        approve=keywords.pop("approve", None),
        on_progress=keywords.pop("on_progress", None),
    )
    overrides: RunOverrides = keywords  # the callbacks are out: what is left is RunOverrides
    return RunOptions.of(options, **overrides), callbacks


class Execution:
    """One streamed execution: iterate it for output chunks, await `result()` for the end."""

    def __init__(
        self,
        call: aio.StreamStreamCall[pb.ClientMessage, pb.ServerEvent],
        local: Mapping[str, ClientTool],
        callbacks: StreamCallbacks,
    ) -> None:
        self._on_progress = callbacks.get("on_progress")
        self.progress: Progress | None = None  # the latest Progress event, if any came
        self._call = call
        self._local = local
        self._on_output = callbacks.get("on_output")
        self._approve = callbacks.get("approve")
        self._write_lock = asyncio.Lock()
        self._chunks: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self.execution_id = ""
        self._pump = asyncio.create_task(self._read())

    async def _send(self, message: pb.ClientMessage) -> None:
        async with self._write_lock:
            with contextlib.suppress(asyncio.InvalidStateError, grpc.RpcError):
                await self._call.write(message)

    async def _read(self) -> ExecutionResult:
        try:
            return await self._events()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc
        finally:
            self._chunks.put_nowait(None)
            for task in self._tasks:
                task.cancel()

    async def _events(self) -> ExecutionResult:
        while True:
            event = await self._call.read()
            if not isinstance(event, pb.ServerEvent):  # end of stream: the status says why
                code = await self._call.code()
                if code != grpc.StatusCode.OK:
                    details = await self._call.details()
                    trailing = await self._call.trailing_metadata()
                    raise error_from_status(code, details, trailing)
                raise Unavailable("the server ended the stream without a result")
            kind = event.WhichOneof("event")
            if kind == "result":
                with contextlib.suppress(asyncio.InvalidStateError, grpc.RpcError):
                    await self._call.done_writing()
                return result_from_proto(event.result)
            if kind == "output":
                chunk = OutputChunk(
                    _STREAM_NAMES.get(event.output.stream, "stdout"), event.output.data
                )
                self._chunks.put_nowait(chunk)
                if self._on_output is not None:
                    outcome = self._on_output(chunk)
                    if inspect.isawaitable(outcome):
                        await outcome
            elif kind == "started":
                self.execution_id = event.started.execution_id
            elif kind == "progress":
                await self._progress(event.progress)
            elif kind == "tool_call":
                self._spawn(self._run_tool(event.tool_call))
            elif kind == "approval":
                self._spawn(self._decide(event.approval))

    async def _progress(self, event: pb.Progress) -> None:
        self.progress = Progress(
            elapsed_s=event.elapsed_ms / 1000,
            tool_calls=event.tool_calls,
            cpu_time_s=event.cpu_time_ms / 1000,
            peak_memory_bytes=event.peak_memory_bytes,
            stdout_bytes=event.stdout_bytes,
            stderr_bytes=event.stderr_bytes,
        )
        if self._on_progress is not None:
            outcome = self._on_progress(self.progress)
            if inspect.isawaitable(outcome):
                await outcome

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_tool(self, request: pb.ToolCallRequest) -> None:
        local = self._local.get(request.tool)
        answer = pb.ToolCallAnswer(seq=request.seq)
        if local is None:
            answer.error = f"the client has no function for tool {request.tool!r}"
        else:
            try:
                # The server's span of this call is the parent of the tool's own spans.
                with client_tool_context(request.trace_context):
                    answer.result_json = await local.invoke_json(request.arguments_json)
            except Exception as exc:
                answer.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        await self._send(pb.ClientMessage(tool_answer=answer))

    async def _decide(self, request: pb.ApprovalRequest) -> None:
        approved, reason = False, "no approver is configured on the client"
        if self._approve is not None:
            try:
                outcome = self._approve(
                    ApprovalRequest(request.seq, request.tool, json.loads(request.arguments_json))
                )
                if inspect.isawaitable(outcome):
                    outcome = await outcome
                approved, reason = outcome if isinstance(outcome, tuple) else (bool(outcome), "")
            except Exception as exc:
                approved, reason = False, f"the approver failed: {type(exc).__name__}: {exc}"
        decision = pb.ApprovalDecision(seq=request.seq, approved=approved, reason=reason)
        await self._send(pb.ClientMessage(approval=decision))

    async def result(self) -> ExecutionResult:
        """The full result; cancelling this await cancels the execution."""
        try:
            return await asyncio.shield(self._pump)
        except asyncio.CancelledError:
            self._call.cancel()
            raise

    async def cancel(self, reason: str = "") -> None:
        """Asks the server to end the execution; its result says `cancelled`."""
        await self._send(pb.ClientMessage(cancel=pb.Cancel(reason=reason)))

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        """The output as it comes, until the stream is over; a stream that failed (the server
        gone mid-run, the call's deadline) ends it with the error `result` raises, not as if
        the output were complete. The end stays queued: iterating again ends at once."""
        while True:
            chunk = await self._chunks.get()
            if chunk is None:
                self._chunks.put_nowait(None)
                break
            yield chunk
        await asyncio.wait([self._pump])  # ends with the end it queued (its `finally`)
        if not self._pump.cancelled() and (error := self._pump.exception()) is not None:
            raise error


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
    ) -> None:
        """A client of the server at ``target``; with ``tls_ca`` (the CA bundle to trust) or a
        client certificate (``tls_cert`` and ``tls_key``, for mTLS), over TLS. Each is a PEM
        file's path or its bytes; TLS without ``tls_ca`` trusts the system's CAs. ``retry``
        bounds how often an execution whose outcome is unknown is asked for again by its
        idempotency key (`sandbox.client._retry`; ``RetryPolicy(attempts=1)``: never)."""
        self.target = target
        self.retry = retry or RetryPolicy()
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
            raise error_from_status(code, details, trailing) from exc
        return Execution(call, local, callbacks)

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
        while True:
            number += 1
            try:
                return await attempt(deadline.remaining())
            except PtcError as error:
                if not retryable(error):
                    raise
                pause = self.retry.delay(number)
                if number >= self.retry.attempts or not deadline.allows(pause):
                    unknown_outcome(error, key, number)
                    raise
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
            async with translated():
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
        async with translated():
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
        async with translated():
            record = await self._stub.GetExecution(
                pb.GetExecutionRequest(execution_id=execution_id), metadata=self._metadata
            )
        return record_from_proto(record)

    async def list_executions(self, query: ExecutionQuery | None = None) -> ExecutionPage:
        """One page of this tenant's records, newest first, filtered by ``query``."""
        async with translated():
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
        return AsyncSession(
            self, tools, SessionOptions.of(options, **overrides), session_id=session_id
        )

    async def list_sessions(self, include_ended: bool = False) -> list[SessionInfo]:
        async with translated():
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
        async with translated():
            message = await self._stub.Replay(request, metadata=self._metadata, timeout=timeout)
        return report_from_proto(message)


def _execute_request(
    script: str, tools: str | Sequence[ToolLike] | None, options: RunOptions
) -> tuple[pb.ExecuteRequest, dict[str, ClientTool]]:
    """The request for ``script`` and the client's own functions among ``tools``; a session's
    cell given no ``tools`` (None) keeps the session's."""
    manifest, local = build_manifest(tools or ())
    keep = tools is None and bool(options.session_id)
    return request_to_proto(Request(script, None if keep else manifest, options)), local
