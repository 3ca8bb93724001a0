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

The clients import this module and it imports neither of them, so the three make no circle. What
a session needs of its client is a value the client hands it: `SessionCalls` (the session RPCs
bound to the client's channel and credentials, and the client's `execute` for cells) for an
`AsyncSession`, and a `LoopRunner` (the blocking client's way of running a coroutine on its loop)
for a `SyncSession`. Neither names an attribute of the clients.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, Unpack

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client._errors import translated
from sandbox.client.tools import build_manifest
from sandbox.codec.limits import limits_to_proto
from sandbox.codec.session import session_from_proto
from sandbox.codec.values import BACKEND_ENUM
from sandbox.errors import FailedPrecondition, NotFound
from sandbox.options import RunOptions, RunOverrides, SessionOptions
from sandbox.records import SessionInfo
from sandbox.request_caps import check_labels
from sandbox.result import ExecutionResult

__all__ = ["AsyncSession", "LoopRunner", "SessionCalls", "SyncSession"]

T = TypeVar("T")


_Tools = str | Sequence[Mapping[str, Any]] | None


@dataclass(frozen=True)
class SessionCalls:
    """What an `AsyncSession` calls through its `AsyncClient`, handed over when the client makes
    the session: each session RPC with the client's channel and metadata bound, and the client's
    ``execute`` for the session's cells (which then go through the client's retries)."""

    create: Callable[[pb.CreateSessionRequest], Awaitable[pb.SessionInfo]]
    get: Callable[[pb.GetSessionRequest], Awaitable[pb.SessionInfo]]
    close: Callable[[pb.CloseSessionRequest], Awaitable[pb.SessionInfo]]
    execute: Callable[[str, _Tools, RunOptions | None], Awaitable[ExecutionResult]]


class LoopRunner(Protocol):
    """What a `SyncSession` needs of its blocking `Client`: run a coroutine on the client's loop
    and return its result (the client's own ``_call``, handed over as a bound method)."""

    def __call__(self, coroutine: Coroutine[Any, Any, T], /) -> T: ...


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, round(seconds * 1000))


class AsyncSession:
    """A session of an `AsyncClient`; created on entry (or `create`), closed on exit."""

    def __init__(
        self,
        calls: SessionCalls,
        tools: str | Sequence[Mapping[str, Any]] = (),
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
    ) -> None:
        self._calls = calls
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
            message = await self._calls.create(request)
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
        return await self._calls.execute(script, tools, chosen)

    async def get(self) -> SessionInfo:
        async with translated():
            message = await self._calls.get(pb.GetSessionRequest(session_id=self.id))
        self.info = session_from_proto(message)
        return self.info

    async def close(self) -> SessionInfo:
        async with translated():
            message = await self._calls.close(pb.CloseSessionRequest(session_id=self.id))
        self.info = session_from_proto(message)
        return self.info


class SyncSession:
    """The blocking `Client`'s session: the same calls, run on the client's loop."""

    def __init__(self, run: LoopRunner, session: AsyncSession) -> None:
        self._run = run
        self._session = session

    @property
    def id(self) -> str:
        return self._session.id

    @property
    def info(self) -> SessionInfo | None:
        """What the last `create`, `get` or `close` said about the session."""
        return self._session.info

    def __enter__(self) -> SyncSession:
        self._run(self._session.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._run(self._session.__aexit__(*exc))

    def create(self) -> SessionInfo:
        return self._run(self._session.create())

    def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None = None,
        options: RunOptions | None = None,
        **overrides: Unpack[RunOverrides],
    ) -> ExecutionResult:
        return self._run(self._session.execute(script, tools, RunOptions.of(options, **overrides)))

    def get(self) -> SessionInfo:
        return self._run(self._session.get())

    def close(self) -> SessionInfo:
        return self._run(self._session.close())
