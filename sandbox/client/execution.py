"""`Execution`: one streamed execution in flight (`ExecuteStream`), as `AsyncClient.start`
returns it and `AsyncClient.run` awaits it.

It reads the server's events as they come: output chunks are queued for iteration and given to
``on_output``; a call of one of the client's own tools runs here (as its own task, so that calls
run concurrently) and its answer is written back into the stream; a call that needs approval is
put to ``approve``, whose refusal (or failure, or absence) is sent as a denial with its reason;
progress events update `Execution.progress` and go to ``on_progress``. The stream ends with the
result, or with a status that is raised as its `sandbox.errors` class.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import grpc
from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client._errors import error_from_rpc, error_from_status
from sandbox.client.tools import ClientTool
from sandbox.codec.result import result_from_proto
from sandbox.errors import Unavailable
from sandbox.keepalive import Keepalive
from sandbox.options import RunOptions, RunOverrides
from sandbox.result import ExecutionResult
from sandbox.telemetry.progress import ProgressSnapshot as Progress
from sandbox.telemetry.tracing import client_tool_context

__all__ = [
    "ApprovalRequest",
    "Approve",
    "Execution",
    "OnOutput",
    "OnProgress",
    "OutputChunk",
    "StreamCallbacks",
    "StreamKeywords",
    "split_keywords",
]

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
        keepalive: Keepalive | None = None,
    ) -> None:
        self._keepalive = keepalive  # names an unanswered ping in the error it ends with
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
            raise error_from_rpc(exc, self._keepalive) from exc
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
                    raise error_from_status(code, details, trailing, self._keepalive)
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
