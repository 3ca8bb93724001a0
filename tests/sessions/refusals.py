"""Raw gRPC calls for the refused-cell tests: a session's cells sent as a client would send
them, unary or streamed, with or without an idempotency key, so that each refusal is seen as
its gRPC status code and message, exactly, and nothing of the SDK (its retries) stands between.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc

__all__ = ["CALLS", "Cell", "Raw", "refused"]

WAIT_S = 60.0  # a bound on waiting for a state, never a measured time


class Raw:
    """One tenant's calls to one server."""

    def __init__(self, address: str, key: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.SandboxServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {key}"),)

    def close(self) -> None:
        self.channel.close()

    def create(self, limits: pb.Limits | None = None) -> str:
        reply: pb.SessionInfo = self.stub.CreateSession(
            pb.CreateSessionRequest(limits=limits), metadata=self.metadata, timeout=WAIT_S
        )
        return str(reply.session_id)

    def get(self, session_id: str) -> pb.SessionInfo:
        info: pb.SessionInfo = self.stub.GetSession(
            pb.GetSessionRequest(session_id=session_id), metadata=self.metadata, timeout=WAIT_S
        )
        return info

    def close_session(self, session_id: str) -> pb.SessionInfo:
        info: pb.SessionInfo = self.stub.CloseSession(
            pb.CloseSessionRequest(session_id=session_id), metadata=self.metadata, timeout=WAIT_S
        )
        return info

    def unary(self, request: pb.ExecuteRequest) -> pb.ExecutionResult:
        result: pb.ExecutionResult = self.stub.Execute(
            request, metadata=self.metadata, timeout=WAIT_S
        )
        return result

    def stream(self, request: pb.ExecuteRequest) -> pb.ExecutionResult:
        events = self.stub.ExecuteStream(
            iter([pb.ClientMessage(start=request)]), metadata=self.metadata, timeout=WAIT_S
        )
        for event in events:
            if event.WhichOneof("event") == "result":
                result: pb.ExecutionResult = event.result
                return result
        raise AssertionError("the stream ended without a result")


Cell = Callable[[Raw, str, str], pb.ExecutionResult]


def _cell(streamed: bool, keyed: bool) -> Cell:
    def send(raw: Raw, session_id: str, script: str) -> pb.ExecutionResult:
        request = pb.ExecuteRequest(
            script=script,
            session_id=session_id,
            idempotency_key=str(uuid.uuid4()) if keyed else "",
        )
        return raw.stream(request) if streamed else raw.unary(request)

    return send


# Every way a cell reaches the server: each refusal is checked on all four.
CALLS = {
    "unary": _cell(False, False),
    "unary-keyed": _cell(False, True),
    "stream": _cell(True, False),
    "stream-keyed": _cell(True, True),
}


def refused(send: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status code and message of a call that must fail."""
    with pytest.raises(grpc.RpcError) as caught:
        send()
    error: Any = caught.value  # a grpc.Call as well as an RpcError
    return error.code(), error.details() or ""


def wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)
