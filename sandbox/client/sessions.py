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
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client._errors import translated
from sandbox.client.tools import build_manifest
from sandbox.errors import FailedPrecondition, NotFound
from sandbox.expectations import ExpectedCalls
from sandbox.files import FilesLike, input_files
from sandbox.limits import check_labels
from sandbox.result import ExecutionResult
from sandbox.wire import BACKEND_ENUM, limits_to_proto, request_to_proto, result_from_proto

if TYPE_CHECKING:
    from sandbox.client.aio import AsyncClient, LimitsLike
    from sandbox.client.sync import Client

__all__ = ["AsyncSession", "SyncSession"]


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(1, round(seconds * 1000))


class AsyncSession:
    """A session of an `AsyncClient`; created on entry (or `create`), closed on exit."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        tools: str | Sequence[Mapping[str, Any]] = (),
        limits: LimitsLike = None,
        backend: str | None = None,
        idle_timeout: float | None = None,
        max_lifetime: float | None = None,
        max_executions: int | None = None,
        labels: Mapping[str, str] | None = None,
        session_id: str | None = None,
        runtime: str | None = None,
    ) -> None:
        self._client = client
        self._runtime = runtime
        self._tools = tools
        self._limits = limits
        self._backend = backend
        self._idle_timeout = idle_timeout
        self._max_lifetime = max_lifetime
        self._max_executions = max_executions
        self._labels = dict(labels or {})
        self.id: str = session_id or ""
        self.info: pb.SessionInfo | None = None

    async def __aenter__(self) -> AsyncSession:
        if not self.id:
            await self.create()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # One that ended already (expired, lost) has nothing left to close.
        with contextlib.suppress(NotFound, FailedPrecondition):
            await self.close()

    async def create(self) -> pb.SessionInfo:
        manifest, local = build_manifest(self._tools)
        if local:
            raise ValueError("a session's tools must be served by the server (echo, mock, host)")
        check_labels(self._labels or {})  # before sending, as the server would refuse them
        request = pb.CreateSessionRequest(
            manifest=pb.ToolManifest(json=manifest), labels=self._labels
        )
        from sandbox.client.aio import _limits

        limits = _limits(self._limits)
        if limits is not None:
            request.limits.CopyFrom(limits_to_proto(limits))
        if self._backend is not None:
            request.backend = BACKEND_ENUM[self._backend]
        if self._runtime is not None:
            request.runtime = self._runtime
        for field, value in (
            ("idle_timeout_ms", _ms(self._idle_timeout)),
            ("max_lifetime_ms", _ms(self._max_lifetime)),
            ("max_executions", self._max_executions),
        ):
            if value is not None:
                setattr(request, field, value)
        async with translated():
            info: pb.SessionInfo = await self._client._stub.CreateSession(
                request, metadata=self._client._metadata
            )
        self.id, self.info = info.session_id, info
        return info

    async def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None = None,
        *,
        limits: LimitsLike = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        files: FilesLike | None = None,
        policy: str | None = None,
        expected_calls: Sequence[ExpectedCalls] = (),
        backend: str | None = None,
        runtime: str | None = None,
    ) -> ExecutionResult:
        """Runs ``script`` as the session's next cell; ``tools`` replaces its tools; ``files``
        are placed in its working directory before it runs; ``policy`` and ``expected_calls``
        apply to the cell as to a single-use execution. The session's backend and runtime were
        fixed when it was created: ``backend`` or ``runtime`` naming another is refused
        (`InvalidArgument`), never ignored."""
        from sandbox.client.aio import _limits

        manifest, local = build_manifest(tools or ())
        if local:
            raise ValueError("a session's tools must be served by the server (echo, mock, host)")
        request = request_to_proto(
            script,
            manifest,
            _limits(limits),
            backend,
            policy,
            tuple(expected_calls),
            labels=labels,
            session_id=self.id,
            files=input_files(files),
        )
        if runtime:
            request.runtime = runtime
        if tools is None:
            request.ClearField("manifest")  # the session keeps its tools
        async with translated():
            message = await self._client._stub.Execute(
                request, metadata=self._client._metadata, timeout=timeout
            )
        return result_from_proto(message)

    async def get(self) -> pb.SessionInfo:
        async with translated():
            info: pb.SessionInfo = await self._client._stub.GetSession(
                pb.GetSessionRequest(session_id=self.id), metadata=self._client._metadata
            )
        self.info = info
        return info

    async def close(self) -> pb.SessionInfo:
        async with translated():
            info: pb.SessionInfo = await self._client._stub.CloseSession(
                pb.CloseSessionRequest(session_id=self.id), metadata=self._client._metadata
            )
        self.info = info
        return info


class SyncSession:
    """The blocking `Client`'s session: the same calls, run on the client's loop."""

    def __init__(self, client: Client, session: AsyncSession) -> None:
        self._client = client
        self._session = session

    @property
    def id(self) -> str:
        return self._session.id

    def __enter__(self) -> SyncSession:
        self._client._call(self._session.__aenter__())
        return self

    def __exit__(self, *exc: object) -> None:
        self._client._call(self._session.__aexit__(*exc))

    def create(self) -> pb.SessionInfo:
        return self._client._call(self._session.create())

    def execute(
        self,
        script: str,
        tools: str | Sequence[Mapping[str, Any]] | None = None,
        *,
        limits: LimitsLike = None,
        labels: Mapping[str, str] | None = None,
        timeout: float | None = None,
        files: FilesLike | None = None,
        policy: str | None = None,
        expected_calls: Sequence[ExpectedCalls] = (),
        backend: str | None = None,
        runtime: str | None = None,
    ) -> ExecutionResult:
        return self._client._call(
            self._session.execute(
                script,
                tools,
                limits=limits,
                labels=labels,
                timeout=timeout,
                files=files,
                policy=policy,
                expected_calls=expected_calls,
                backend=backend,
                runtime=runtime,
            )
        )

    def get(self) -> pb.SessionInfo:
        return self._client._call(self._session.get())

    def close(self) -> pb.SessionInfo:
        return self._client._call(self._session.close())
