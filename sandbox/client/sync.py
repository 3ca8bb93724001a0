"""`Client`: the blocking flavour of `AsyncClient`, for scripts and frameworks without asyncio.

It owns one event loop on a private daemon thread and runs `AsyncClient` there, so that a
streamed execution keeps serving tool calls and approvals while the caller blocks. Callbacks
(``on_output``, ``approve``) run on that thread; plain-function tools run in its worker threads.
`stream` returns a `SyncExecution`: iterate it for output chunks, then call `result()`; a stream
that ends abnormally (the server gone, the client closed) ends the iteration with its error.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar, Unpack

from sandbox.client._retry import RetryPolicy
from sandbox.client.aio import AsyncClient, Progress, Stubs
from sandbox.client.execution import Execution, OutputChunk, StreamKeywords, split_keywords
from sandbox.client.sessions import SyncSession
from sandbox.client.tls import PemLike, read_pems
from sandbox.client.tools import ToolLike
from sandbox.errors import Cancelled
from sandbox.keepalive import Keepalive
from sandbox.options import LimitsLike, RunOptions, RunOverrides, SessionOptions, SessionOverrides
from sandbox.records import ExecutionPage, ExecutionQuery, ExecutionRecord, SessionInfo
from sandbox.replay_report import ReplayReport
from sandbox.result import ExecutionResult

__all__ = ["Client", "SyncExecution"]

T = TypeVar("T")


@dataclass(frozen=True)
class _End:
    """The last item of a `SyncExecution`'s queue: how its stream ended (None: with its result)."""

    error: BaseException | None


class SyncExecution:
    def __init__(self, client: Client, execution: Execution) -> None:
        self._client = client
        self._execution = execution
        self._chunks: queue.Queue[OutputChunk | _End] = queue.Queue()
        # The end is queued by the forwarding's done-callback, not by its own `finally`: a task
        # cancelled before its first step (the client closed at once) never runs its body, and
        # the iterator's untimed wait would then never end.
        client._submit(self._forward()).add_done_callback(self._ended)

    async def _forward(self) -> None:
        async for chunk in self._execution:
            self._chunks.put(chunk)

    def _ended(self, forwarding: Future[None]) -> None:
        if forwarding.cancelled():
            error: BaseException | None = Cancelled("the client was closed while the stream ran")
        else:
            error = forwarding.exception()
        self._chunks.put(_End(error))

    def __iter__(self) -> Iterator[OutputChunk]:
        """The output as it comes. A stream that ended abnormally (the server gone mid-run,
        the call's deadline, the client closed) raises its error here, as `result` does; the
        end stays queued, so iterating again ends (or raises) at once."""
        while not isinstance(item := self._chunks.get(), _End):
            yield item
        self._chunks.put(item)
        if item.error is not None:
            raise item.error

    @property
    def execution_id(self) -> str:
        return self._execution.execution_id

    @property
    def progress(self) -> Progress | None:
        """The latest `Progress` event of a long run, if any came yet."""
        return self._execution.progress

    def result(self, timeout: float | None = None) -> ExecutionResult:
        return self._client._submit(self._execution.result()).result(timeout)

    def cancel(self, reason: str = "") -> None:
        self._client._call(self._execution.cancel(reason))


class Client:
    def __init__(
        self,
        target: str,
        api_key: str | None = None,
        *,
        tls_ca: PemLike | None = None,
        tls_cert: PemLike | None = None,
        tls_key: PemLike | None = None,
        keepalive: Keepalive | None = None,
    ) -> None:
        """As `AsyncClient`: over TLS with ``tls_ca`` or a client certificate (mTLS); with
        ``keepalive`` (`Keepalive`, on by default) bounding how long a call, a `SyncExecution`'s
        iteration included, waits on a server that stopped answering. How often an execution
        whose outcome is unknown is asked for again by its key is `retry`."""
        tls = read_pems(tls_ca, tls_cert, tls_key)  # a bad file is refused here, at once
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ptc-client", daemon=True
        )
        self._thread.start()
        self._async: AsyncClient = self._call(_make(target, api_key, tls, keepalive))

    @property
    def retry(self) -> RetryPolicy:
        """How often an execution whose outcome is unknown is asked for again by its
        idempotency key (`RetryPolicy`); set ``RetryPolicy(attempts=1)`` never to ask again."""
        return self._async.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self._async.retry = policy

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._submit(coroutine).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(_shutdown(self._async))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **keywords: Unpack[StreamKeywords],
    ) -> ExecutionResult:
        """Runs ``script`` to the end, serving its client tools and approvals here; with
        ``session_id``, as that session's next cell. (The caller's current trace context goes
        with it: the loop thread's task starts from a copy of this thread's context.)"""
        chosen, callbacks = split_keywords(options, keywords)
        return self._call(self._async.run(script, tools, chosen, **callbacks))

    def stream(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **keywords: Unpack[StreamKeywords],
    ) -> SyncExecution:
        """Starts an execution; iterate the answer for output, then call `result()`."""
        chosen, callbacks = split_keywords(options, keywords)
        execution = self._call(self._async.start(script, tools, chosen, **callbacks))
        return SyncExecution(self, execution)

    def execute(
        self,
        script: str,
        tools: str | Sequence[ToolLike] | None = (),
        options: RunOptions | None = None,
        **overrides: Unpack[RunOverrides],
    ) -> ExecutionResult:
        """The unary `Execute`: every tool must be served by the server."""
        return self._call(self._async.execute(script, tools, RunOptions.of(options, **overrides)))

    def stubs(self, tools: str | Sequence[ToolLike]) -> Stubs:
        return self._call(self._async.stubs(tools))

    def get_execution(self, execution_id: str) -> ExecutionRecord:
        return self._call(self._async.get_execution(execution_id))

    def list_executions(self, query: ExecutionQuery | None = None) -> ExecutionPage:
        return self._call(self._async.list_executions(query))

    def session(
        self,
        tools: str | Sequence[Mapping[str, Any]] = (),
        options: SessionOptions | None = None,
        *,
        session_id: str | None = None,
        **overrides: Unpack[SessionOverrides],
    ) -> SyncSession:
        """A session: ``with client.session(...) as s: s.execute(...)`` (see `AsyncClient`)."""
        chosen = SessionOptions.of(options, **overrides)
        return SyncSession(self._call, self._async.session(tools, chosen, session_id=session_id))

    def list_sessions(self, include_ended: bool = False) -> list[SessionInfo]:
        return self._call(self._async.list_sessions(include_ended))

    def replay(
        self,
        execution_id: str,
        *,
        tools: str | Sequence[ToolLike] | None = None,
        limits: LimitsLike = None,
        backend: str | None = None,
        timeout: float | None = None,
    ) -> ReplayReport:
        """`AsyncClient.replay`: a recorded execution re-run with its tool calls answered from
        its record, and what differs."""
        return self._call(
            self._async.replay(
                execution_id, tools=tools, limits=limits, backend=backend, timeout=timeout
            )
        )


async def _shutdown(client: AsyncClient) -> None:
    """Closes the channel and ends what is left on the private loop."""
    await client.close()
    current = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


async def _make(
    target: str,
    api_key: str | None,
    tls: tuple[bytes | None, bytes | None, bytes | None],
    keepalive: Keepalive | None,
) -> AsyncClient:
    ca, cert, key = tls
    # The channel binds to the running loop: made here, on the private one.
    return AsyncClient(target, api_key, tls_ca=ca, tls_cert=cert, tls_key=key, keepalive=keepalive)
