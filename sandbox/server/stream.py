"""One `ExecuteStream` session: the client in the loop of a running script.

The first client message carries the request. The execution then runs in its own task (see
`Runner.start`) with two hooks that reach the client: a handler for `client`-mode tools, which
sends a `ToolCallRequest` and waits for the `ToolCallAnswer` of the same seq, and an approver,
which sends an `ApprovalRequest` and waits for the `ApprovalDecision`. Output chunks and the
`Started` event go out as they happen, a `Progress` event about once a second once the script
has run for a second (`sandbox.telemetry.progress`); the last event is the full result.

Nothing here waits without a bound of its own: a client that never answers is stopped by the
script's wall-time limit, which ends the run and with it every pending call. A client that sends
`Cancel`, cancels the RPC or disconnects sets the run's cancel event: the sandbox is killed and
the record says `cancelled`. A malformed client message (bytes that are not a `ClientMessage`,
an empty one, a second `start`, an answer nobody asked for) ends the stream at once with
INVALID_ARGUMENT naming the field, and cancels the run the same way: the sandbox is stopped and
the record says `cancelled`. No task is left behind: a write that fails because the RPC is
ending (cancelled, past its deadline) ends its writer quietly.

The session reads and writes through the servicer context (``context.read``/``context.write``)
rather than an async generator fed by a queue: a tool call is written by the task that makes it,
at once, and only events that arrive while another write is in flight wait in a small outbox,
which the writing task empties in order. Half the latency of a client-side tool call is these
hops, so they are kept to what gRPC itself needs (see bench/grpc.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

from grpc import aio

from sandbox._proto import sandbox_pb2 as pb
from sandbox.audit.base import KeyTaken
from sandbox.codec.limits import limits_to_proto
from sandbox.codec.result import result_to_proto
from sandbox.engine import ExecutionRequest, RunHooks, StartedInfo
from sandbox.errors import InvalidArgument
from sandbox.handlers import Approval, ToolCall, ToolFailure
from sandbox.server import idempotency
from sandbox.server.boundary import checked
from sandbox.server.convert import execution_request
from sandbox.server.runner import Prepared, Runner, rebuild_bounds
from sandbox.sessions.cells import cell_request
from sandbox.telemetry.progress import PROGRESS_AFTER_S, PROGRESS_EVERY_S, LiveProbe
from sandbox.telemetry.tracing import inject_current
from sandbox.tenants.base import Tenant

__all__ = ["StreamSession"]

_STREAMS = {"stdout": pb.STREAM_STDOUT, "stderr": pb.STREAM_STDERR}
Context = aio.ServicerContext[pb.ClientMessage, pb.ServerEvent]
WRITE_SETTLE_S = 2.0


class StreamSession:
    def __init__(self, runner: Runner, tenant: Tenant, context: Context) -> None:
        self.runner = runner
        self.tenant = tenant
        self.context = context
        self.cancel = asyncio.Event()
        self._outbox: deque[pb.ServerEvent] = deque()
        self._writing = False
        self._closing = False  # the stream is ending: nothing more is written
        self._quiet = asyncio.Event()  # set while no write is in flight
        self._quiet.set()
        self._writers: set[asyncio.Task[None]] = set()
        self._failed: asyncio.Future[InvalidArgument] = asyncio.get_running_loop().create_future()
        self._tools: dict[int, asyncio.Future[pb.ToolCallAnswer]] = {}
        self._approvals: dict[int, asyncio.Future[pb.ApprovalDecision]] = {}
        self._asked_tools: set[int] = set()
        self._asked_approvals: set[int] = set()
        self._ticker: asyncio.Task[None] | None = None  # sends `progress` while it runs
        self._output_bytes = {"stdout": 0, "stderr": 0}

    async def serve(self, first: Any = None) -> None:
        """Runs the stream to its end; raises `InvalidArgument` for a malformed client message.
        ``first`` is the client's first message when the caller has read it already."""
        if first is None:
            first = checked(await self.context.read())
        if not isinstance(first, pb.ClientMessage):  # the client closed without a request
            return
        kind = first.WhichOneof("message")
        if kind != "start":
            raise InvalidArgument(f"start: the first message must be `start`, not `{kind}`")
        request = execution_request(first.start, self.tenant.script_policy)
        store, tenant_id = self.runner.store, self.tenant.id
        earlier = await idempotency.admitted(store, tenant_id, request.idempotency_key)
        if earlier is not None:  # admitted before, by any server: its result, not a rerun
            await self._keyed(first.start, earlier)
            return
        prepared = await self._prepare(first.start, request)
        hooks = RunHooks(
            handlers={"client": self._client_tool},
            approver=self._approve,
            on_output=self._output,
            on_started=self._started,
            cancel=self.cancel,
        )
        run = self.runner.start(prepared, hooks)
        reader = asyncio.create_task(self._read())
        try:
            ends: list[asyncio.Future[Any]] = [run, self._failed]
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
            if self._failed.done():
                raise self._failed.result()
            final = await self._final_event(first.start, run)
            while self._writing:  # another writer holds the stream: let it finish first
                await self._quiet.wait()
            await self._write(final)  # after whatever is still queued
        finally:
            await self._wind_down(run, reader)

    async def _prepare(self, start: pb.ExecuteRequest, request: ExecutionRequest) -> Prepared:
        """The run the start asks for: in its session (resumed, or rebuilt here) when it names
        one, single-use otherwise."""
        session = None
        if start.session_id:
            session = await self.runner.sessions.resume(
                self.tenant.id,
                start.session_id,
                rebuild_bounds(self.tenant),
                admit=lambda: self.runner.tenancy.admit(self.tenant),
            )
            request = cell_request(session, request, manifest_given=start.HasField("manifest"))
        return self.runner.prepare(self.tenant, request, streamed=True, session=session)

    async def _final_event(self, start: pb.ExecuteRequest, run: asyncio.Task[Any]) -> Any:
        """The stream's last event: the run's result, or, where another server admitted the
        same key first, that execution's (`idempotency.answer`)."""
        taken = run.exception()
        if isinstance(taken, KeyTaken):
            result = await idempotency.answer(
                self.runner.store, self.runner.engine, self.tenant.id, start, taken.execution_id
            )
            return pb.ServerEvent(result=result)
        return pb.ServerEvent(result=result_to_proto(run.result()))

    async def _wind_down(self, run: asyncio.Task[Any], reader: asyncio.Task[Any]) -> None:
        """Stops what the stream started: the ticker, the run (cancelled if it has not ended),
        the reader and every writer."""
        if self._ticker is not None:
            self._ticker.cancel()
        self._closing = True
        if not run.done():
            self.cancel.set()
        reader.cancel()
        # gRPC allows one write in flight per call, and cancelling the task that awaits it
        # does not withdraw it: let it complete before the RPC ends (an abort would
        # otherwise collide with it).
        # asyncio.timeout, not wait_for, which on Python 3.11 may swallow a cancel.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WRITE_SETTLE_S):
                await self._quiet.wait()
        for task in (reader, *self._writers):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(reader, *self._writers)

    async def _keyed(self, request: pb.ExecuteRequest, execution_id: str) -> None:
        """Answers a start whose key was admitted before: `Started` with that execution's id,
        then its result once it has ended (`idempotency.answer`). Client messages that follow
        are read and dropped: nothing runs here to take a tool answer."""
        await self.context.write(pb.ServerEvent(started=pb.Started(execution_id=execution_id)))
        result = await idempotency.answer(
            self.runner.store, self.runner.engine, self.tenant.id, request, execution_id
        )
        await self.context.write(pb.ServerEvent(result=result))

    # -- client → server -----------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            while isinstance(message := checked(await self.context.read()), pb.ClientMessage):
                self._dispatch(message)
        except InvalidArgument as exc:
            if not self._failed.done():
                self._failed.set_result(exc)
        except asyncio.CancelledError:
            raise
        except Exception:  # the client went away: the RPC's own cancellation follows
            return

    def _dispatch(self, message: pb.ClientMessage) -> None:
        kind = message.WhichOneof("message")
        if kind == "tool_answer":
            answer = message.tool_answer
            if answer.WhichOneof("outcome") is None:
                raise InvalidArgument(
                    f"tool_answer.outcome: call {answer.seq} has neither result_json nor error"
                )
            _resolve(self._tools, self._asked_tools, answer.seq, answer, "tool_answer.seq")
        elif kind == "approval":
            decision = message.approval
            _resolve(self._approvals, self._asked_approvals, decision.seq, decision, "approval.seq")
        elif kind == "cancel":
            self.cancel.set()
        elif kind == "start":
            raise InvalidArgument("start: sent twice; one stream runs one execution")
        else:
            raise InvalidArgument("message: empty client message")

    # -- server → client -----------------------------------------------------------------------
    def _emit(self, event: pb.ServerEvent) -> None:
        """Sends ``event`` after those before it, from a callback that cannot wait."""
        if self._closing:
            return
        self._outbox.append(event)
        if not self._writing:
            task = asyncio.create_task(self._write(None))
            self._writers.add(task)
            task.add_done_callback(self._writers.discard)

    async def _write(self, event: pb.ServerEvent | None) -> None:
        """Writes ``event`` (if any) and everything queued, in order; when another write is in
        flight, queues ``event`` for that writer instead."""
        if self._closing:
            return
        if self._writing:
            if event is not None:
                self._outbox.append(event)
            return
        self._writing = True
        self._quiet.clear()
        try:
            # The outbox goes first: it holds what was emitted before ``event``.
            if event is not None:
                self._outbox.append(event)
            while self._outbox and not self._closing:
                await self.context.write(self._outbox.popleft())
        except Exception:  # grpc's ExecuteBatchError, InvalidStateError, ...
            # The RPC is ending (cancelled, past its deadline, aborted): its cancellation ends
            # the run; nothing more can be written, and nothing is left for anyone to retrieve.
            self._outbox.clear()
        finally:
            self._writing = False
            self._quiet.set()

    def _started(self, info: StartedInfo) -> None:
        self._emit(
            pb.ServerEvent(
                started=pb.Started(
                    execution_id=info.execution_id,
                    effective_limits=limits_to_proto(info.limits),
                    isolation=info.isolation,
                )
            )
        )
        if info.probe is not None:
            self._ticker = asyncio.create_task(self._tick(info.probe))

    async def _tick(self, probe: LiveProbe) -> None:
        """A `Progress` event every `PROGRESS_EVERY_S` once a run is past `PROGRESS_AFTER_S`."""
        await asyncio.sleep(PROGRESS_AFTER_S)
        while not self._closing:
            now = probe.snapshot(self._output_bytes["stdout"], self._output_bytes["stderr"])
            self._emit(
                pb.ServerEvent(
                    progress=pb.Progress(
                        elapsed_ms=int(now.elapsed_s * 1000),
                        tool_calls=now.tool_calls,
                        cpu_time_ms=int(now.cpu_time_s * 1000),
                        peak_memory_bytes=now.peak_memory_bytes,
                        stdout_bytes=now.stdout_bytes,
                        stderr_bytes=now.stderr_bytes,
                    )
                )
            )
            await asyncio.sleep(PROGRESS_EVERY_S)

    def _output(self, stream: str, data: bytes) -> None:
        self._output_bytes[stream] += len(data)
        self._emit(pb.ServerEvent(output=pb.OutputChunk(stream=_STREAMS[stream], data=data)))

    async def _ask(
        self,
        seq: int,
        pending: dict[int, asyncio.Future[Any]],
        asked: set[int],
        event: pb.ServerEvent,
    ) -> Any:
        """Sends a request to the client and waits for its answer of the same seq."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending[seq] = future
        asked.add(seq)
        await self._write(event)
        try:
            return await future
        finally:
            pending.pop(seq, None)

    async def _client_tool(self, call: ToolCall) -> Any:
        request = pb.ToolCallRequest(
            seq=call.seq,
            tool=call.tool.name,
            arguments_json=json.dumps(call.arguments, ensure_ascii=False),
            idempotency_key=call.idempotency_key,
        )
        inject_current(request.trace_context)  # the call's span, for the client tool's spans
        answer: pb.ToolCallAnswer = await self._ask(
            call.seq, self._tools, self._asked_tools, pb.ServerEvent(tool_call=request)
        )
        if answer.WhichOneof("outcome") == "error":
            raise ToolFailure(answer.error or "the client's tool failed")
        try:
            return json.loads(answer.result_json)
        except ValueError as exc:
            raise ToolFailure(
                f"the client answered with a result that is not JSON: {exc}"
            ) from None

    async def _approve(self, call: ToolCall) -> Approval:
        request = pb.ApprovalRequest(
            seq=call.seq,
            tool=call.tool.name,
            arguments_json=json.dumps(call.arguments, ensure_ascii=False),
        )
        decision: pb.ApprovalDecision = await self._ask(
            call.seq, self._approvals, self._asked_approvals, pb.ServerEvent(approval=request)
        )
        return Approval(decision.approved, decision.reason)


def _resolve(
    pending: dict[int, asyncio.Future[Any]], asked: set[int], seq: int, value: Any, field: str
) -> None:
    future = pending.get(seq)
    if future is None:
        if seq in asked:  # a late answer to a call that already ended: harmless
            return
        raise InvalidArgument(f"{field}: no call {seq} is waiting for an answer")
    if not future.done():
        future.set_result(value)
