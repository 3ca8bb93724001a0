"""Sessions in the client SDK: one sandbox kept across executions, as a context manager.

    async with client.session(tools=manifest, idle_timeout=300) as session:
        await session.execute("x = 1")
        result = await session.execute("x += 1\\nx")    # result.value == "2"

    with Client(target) as client, client.session() as session:
        session.execute("import math")

Leaving the block closes the session (one that already ended is not an error there). Executions
in a session run one at a time: a second one while one runs is refused with
`FailedPrecondition`; an ended session's id gives `NotFound` (closed, expired) or
`FailedPrecondition` (lost), each with a message that starts with ``session_lost`` and says why.

The clients import this module and it imports neither of them: what a session needs of its
client is named here as a protocol (`SessionClient`, `SessionRunner`), which `AsyncClient` and
`Client` meet as they are, so that the three modules make no circle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar, Unpack

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client._errors import translated
from sandbox.client.tools import build_manifest
from sandbox.codec.limits import limits_to_proto
from sandbox.codec.session import session_from_proto
from sandbox.codec.values import BACKEND_ENUM
from sandbox.errors import FailedPrecondition, NotFound
from sandbox.limits import check_labels
from sandbox.options import RunOptions, RunOverrides, SessionOptions
from sandbox.records import SessionInfo
from sandbox.result import ExecutionResult

__all__ = ["AsyncSession", "SyncSession"]

T = TypeVar("T")


class SessionClient(Protocol):
    """What an `AsyncSession` uses of its `AsyncClient`: the channel's stub and metadata for the
    session calls, and `execute` for its cells (which then go through the client's retries)."""

    @property
    def _stub(self) -> pb_grpc.SandboxServiceStub: ...

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]: ...

    async def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None,
        options: RunOptions | None,
    ) -> ExecutionResult: ...


class SessionRunner(Protocol):
    """What a `SyncSession` uses of its `Client`: running a coroutine on the client's loop."""

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T: ...


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, round(seconds * 1000))


class AsyncSession:
    """A session of an `AsyncClient`; created on entry (or `create`), closed on exit."""

    def __init__(
        self,
        client: SessionClient,
        tools: str | Sequence[Mapping[str, Any]] = (),
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
    ) -> None:
        self._client = client
        self._tools = tools
        self.options = options or SessionOptions()
        self.id: str = session_id or ""
        self.info: SessionInfo | None = None

    async def __aenter__(self) -> AsyncSession:
        if not self.id:
            await self.create()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # One that ended already (expired, lost) has nothing left to close.
        with contextlib.suppress(NotFound, FailedPrecondition):
            await self.close()

    async def create(self) -> SessionInfo:
        manifest, local = build_manifest(self._tools)
        if local:
            raise ValueError("a session's tools must be served by the server (echo, mock, host)")
        options = self.options
        check_labels(options.labels)  # before sending, as the server would refuse them
        request = pb.CreateSessionRequest(
            manifest=pb.ToolManifest(json=manifest), labels=dict(options.labels)
        )
        if options.limits is not None:
            request.limits.CopyFrom(limits_to_proto(options.limits))
        if options.backend is not None:
            request.backend = BACKEND_ENUM[options.backend]
        if options.runtime is not None:
            request.runtime = options.runtime
        for field, value in (
            ("idle_timeout_ms", _ms(options.idle_timeout)),
            ("max_lifetime_ms", _ms(options.max_lifetime)),
            ("max_executions", options.max_executions),
        ):
            if value is not None:
                setattr(request, field, value)
        async with translated():
            message = await self._client._stub.CreateSession(
                request, metadata=self._client._metadata
            )
        info = session_from_proto(message)
        self.id, self.info = info.session_id, info
        return info

    async def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None = None,
        options: RunOptions | None = None,
        **overrides: Unpack[RunOverrides],
    ) -> ExecutionResult:
        """Runs ``script`` as the session's next cell; ``tools`` replaces its tools; ``files``
        are placed in its working directory before it runs; ``policy`` and ``expected_calls``
        apply to the cell as to a single-use execution. The session's backend and runtime were
        fixed when it was created: ``backend`` or ``runtime`` naming another is refused
        (`InvalidArgument`), never ignored."""
        chosen = replace(RunOptions.of(options, **overrides), session_id=self.id)
        if tools is not None and build_manifest(tools)[1]:
            raise ValueError("a session's tools must be served by the server (echo, mock, host)")
        return await self._client.execute(script, tools, chosen)

    async def get(self) -> SessionInfo:
        async with translated():
            message = await self._client._stub.GetSession(
                pb.GetSessionRequest(session_id=self.id), metadata=self._client._metadata
            )
        self.info = session_from_proto(message)
        return self.info

    async def close(self) -> SessionInfo:
        async with translated():
            message = await self._client._stub.CloseSession(
                pb.CloseSessionRequest(session_id=self.id), metadata=self._client._metadata
            )
        self.info = session_from_proto(message)
        return self.info


class SyncSession:
    """The blocking `Client`'s session: the same calls, run on the client's loop."""

    def __init__(self, client: SessionRunner, session: AsyncSession) -> None:
        self._client = client
        self._session = session

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def info(self) -> SessionInfo | None:
        """What the last `create`, `get` or `close` said about the session."""
        return self._session.info

    def __enter__(self) -> SyncSession:
        self._client._call(self._session.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._client._call(self._session.__aexit__(*exc))

    def create(self) -> SessionInfo:
        return self._client._call(self._session.create())

    def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None = None,
        options: RunOptions | None = None,
        **overrides: Unpack[RunOverrides],
    ) -> ExecutionResult:
        return self._client._call(
            self._session.execute(script, tools, RunOptions.of(options, **overrides))
        )

    def get(self) -> SessionInfo:
        return self._client._call(self._session.get())

    def close(self) -> SessionInfo:
        return self._client._call(self._session.close())
