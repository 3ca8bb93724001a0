"""One `ExecuteStream` session: the client in the loop of a running script.

The first client message carries the request. The execution then runs in its own task (see
`Runner.start`) with two hooks that reach the client: a handler for `client`-mode tools, which
sends a `ToolCallRequest` and waits for the `ToolCallAnswer` of the same seq, and an approver,
which sends an `ApprovalRequest` and waits for the `ApprovalDecision`. Output chunks and the
`Started` event go out as they happen; the last event is the full result.

Nothing here waits without a bound of its own: a client that never answers is stopped by the
script's wall-time limit, which ends the run and with it every pending call. A client that sends
`Cancel`, cancels the RPC or disconnects sets the run's cancel event: the sandbox is killed and
the record says `cancelled`. A malformed client message ends the stream with INVALID_ARGUMENT
naming the field (and cancels the run the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.engine import StartedInfo
from sandbox.errors import InvalidArgument
from sandbox.handlers import Approval, ToolCall, ToolFailure
from sandbox.server.convert import limits_to_proto, request_from_proto, result_to_proto
from sandbox.server.runner import Runner
from sandbox.tenants.base import Tenant

__all__ = ["StreamSession"]

_STREAMS = {"stdout": pb.STREAM_STDOUT, "stderr": pb.STREAM_STDERR}


class _Done:
    """Queued after the run's last event."""


class StreamSession:
    def __init__(self, runner: Runner, tenant: Tenant) -> None:
        self.runner = runner
        self.tenant = tenant
        self.cancel = asyncio.Event()
        self._events: asyncio.Queue[pb.ServerEvent | BaseException | _Done] = asyncio.Queue()
        self._tools: dict[int, asyncio.Future[pb.ToolCallAnswer]] = {}
        self._approvals: dict[int, asyncio.Future[pb.ApprovalDecision]] = {}
        self._asked_tools: set[int] = set()
        self._asked_approvals: set[int] = set()

    async def serve(
        self, requests: AsyncIterator[pb.ClientMessage]
    ) -> AsyncIterator[pb.ServerEvent]:
        first = await anext(aiter(requests), None)
        if first is None:
            return
        kind = first.WhichOneof("message")
        if kind != "start":
            raise InvalidArgument(f"start: the first message must be `start`, not `{kind}`")
        request = request_from_proto(first.start, self.tenant.script_policy)
        prepared = self.runner.prepare(self.tenant, request, streamed=True)
        run = self.runner.start(
            prepared,
            cancel=self.cancel,
            handlers={"client": self._client_tool},
            approver=self._approve,
            on_output=self._output,
            on_started=self._started,
        )
        run.add_done_callback(lambda _task: self._events.put_nowait(_Done()))
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                item = await self._events.get()
                if isinstance(item, _Done):
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
            yield pb.ServerEvent(result=result_to_proto(run.result()))
        finally:
            if not run.done():
                self.cancel.set()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    # -- client → server -----------------------------------------------------------------------
    async def _read(self, requests: AsyncIterator[pb.ClientMessage]) -> None:
        try:
            async for message in requests:
                self._dispatch(message)
        except InvalidArgument as exc:
            self._events.put_nowait(exc)
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
    def _started(self, info: StartedInfo) -> None:
        self._events.put_nowait(
            pb.ServerEvent(
                started=pb.Started(
                    execution_id=info.execution_id,
                    effective_limits=limits_to_proto(info.limits),
                    isolation=info.isolation,
                )
            )
        )

    def _output(self, stream: str, data: bytes) -> None:
        self._events.put_nowait(
            pb.ServerEvent(output=pb.OutputChunk(stream=_STREAMS[stream], data=data))
        )

    async def _client_tool(self, call: ToolCall) -> Any:
        future: asyncio.Future[pb.ToolCallAnswer] = asyncio.get_running_loop().create_future()
        self._tools[call.seq] = future
        self._asked_tools.add(call.seq)
        self._events.put_nowait(
            pb.ServerEvent(
                tool_call=pb.ToolCallRequest(
                    seq=call.seq,
                    tool=call.tool.name,
                    arguments_json=json.dumps(call.arguments, ensure_ascii=False),
                    idempotency_key=call.idempotency_key,
                )
            )
        )
        try:
            answer = await future
        finally:
            self._tools.pop(call.seq, None)
        if answer.WhichOneof("outcome") == "error":
            raise ToolFailure(answer.error or "the client's tool failed")
        try:
            return json.loads(answer.result_json)
        except ValueError as exc:
            raise ToolFailure(
                f"the client answered with a result that is not JSON: {exc}"
            ) from None

    async def _approve(self, call: ToolCall) -> Approval:
        future: asyncio.Future[pb.ApprovalDecision] = asyncio.get_running_loop().create_future()
        self._approvals[call.seq] = future
        self._asked_approvals.add(call.seq)
        self._events.put_nowait(
            pb.ServerEvent(
                approval=pb.ApprovalRequest(
                    seq=call.seq,
                    tool=call.tool.name,
                    arguments_json=json.dumps(call.arguments, ensure_ascii=False),
                )
            )
        )
        try:
            decision = await future
        finally:
            self._approvals.pop(call.seq, None)
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
