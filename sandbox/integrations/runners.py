"""Where an execute-tool call runs: a `ptc serve` server through the client SDK, or an embedded
`Engine` — one small interface, `ScriptRunner`, so every adapter works with both.

A runner takes the script, the tools (manifest entries, plain functions, `ClientTool`s), limits
and expected call counts, and returns the `ExecutionResult`. It offers a blocking `run` (for
frameworks that call tools synchronously: LangChain's `_run`, smolagents' executor) and an
awaitable `arun` (OpenAI Agents, the MCP server). Both flavours own a private event loop on a
daemon thread, so they can be called from any thread and from inside someone else's loop.

`EmbeddedRunner` runs each script through `Engine.prepare` and `sandbox.recording.Recorder` (the
one path every execution takes; with an audit store it is recorded like the server's). It
serves `client`-mode tools itself: the engine's `client` handler looks the tool up among the
functions of this run and calls it, so a plain Python function is a tool with no server in
between, exactly as it is through `Client.run`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, Unpack

from sandbox.audit.base import AuditStore
from sandbox.client import Client
from sandbox.client.tls import TlsFiles
from sandbox.client.tools import ClientTool, ToolLike, build_manifest
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, RunHooks, StartedInfo
from sandbox.errors import InvalidArgument, Unavailable
from sandbox.handlers import ToolCall, ToolFailure, ToolHandler
from sandbox.limits import Limits
from sandbox.options import RunOptions
from sandbox.recording import Recorder
from sandbox.replay_report import ReplayReport
from sandbox.request_caps import check_labels
from sandbox.result import ExecutionResult
from sandbox.sessions.manager import SessionManager
from sandbox.telemetry.progress import PROGRESS_AFTER_S, PROGRESS_EVERY_S, ProgressSnapshot

__all__ = [
    "ClientRunner",
    "EmbeddedRunner",
    "RunRequest",
    "ScriptRunner",
    "execution_request",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RunRequest:
    """One script to run, its tools, and how (`RunOptions`: limits, expected calls, policy,
    input files, ...)."""

    script: str
    tools: Sequence[ToolLike] = ()
    options: RunOptions = field(default_factory=RunOptions)
    # Live progress of a long run (about once a second past the first); called on a thread of
    # the runner's, not the caller's.
    on_progress: Callable[[ProgressSnapshot], Any] | None = None


def execution_request(script: str, manifest: str, options: RunOptions) -> ExecutionRequest:
    """The engine's request for ``options`` (their None: the engine's defaults). Refuses what
    an engine in this process cannot honour rather than ignoring it: the timeout is the SDK's
    call deadline, and a session's cell runs through its session runner."""
    if options.timeout is not None:
        raise InvalidArgument("timeout: the client SDK's call deadline; not for an embedded run")
    if options.session_id:
        raise InvalidArgument(
            "session_id: an embedded session's cells run through its runner (open_session)"
        )
    check_labels(options.labels)  # as a server would: no key of the server's own namespace
    return ExecutionRequest(
        script=script,
        manifest=manifest,
        limits=options.limits or Limits(),
        backend=options.backend,
        policy=options.policy or "none",
        expected_calls=options.expected_calls,
        labels=dict(options.labels),
        runtime=options.runtime,
        files=options.files,
    )


class ScriptRunner(Protocol):
    def run(self, request: RunRequest) -> ExecutionResult: ...

    async def arun(self, request: RunRequest) -> ExecutionResult: ...

    def close(self) -> None: ...


class ClientRunner:
    """Runs scripts on a `ptc serve` server; client-mode tools run here, in this process."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @classmethod
    def connect(
        cls, target: str, api_key: str | None = None, **tls: Unpack[TlsFiles]
    ) -> ClientRunner:
        """A runner on the server at ``target``; ``tls`` as `Client`'s (tls_ca, tls_cert,
        tls_key)."""
        return cls(Client(target, api_key, **tls))

    def run(self, request: RunRequest) -> ExecutionResult:
        return self.client.run(
            request.script, list(request.tools), request.options, on_progress=request.on_progress
        )

    async def arun(self, request: RunRequest) -> ExecutionResult:
        # `Client` blocks on its own loop thread; a worker thread keeps the caller's loop free.
        return await asyncio.to_thread(self.run, request)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ClientRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _LoopThread:
    """A private event loop on a daemon thread: coroutines go in from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def acall(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return await asyncio.wrap_future(future)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class EmbeddedRunner:
    """Runs scripts on an in-process `Engine` (the process backend unless configured).

    With ``audit`` (an `AuditStore`, or a SQLite path / PostgreSQL URL to open) every execution
    is recorded by `sandbox.recording.Recorder`, as the server records its own: admitted, then
    completed or failed. The runner closes a store it opened itself."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        audit: AuditStore | str | None = None,
        tenant: str = "default",
    ) -> None:
        self._owned_store: AuditStore | None = None
        store = audit if not isinstance(audit, str) else None
        if isinstance(audit, str):
            from sandbox.audit import open_store

            store = self._owned_store = open_store(audit, instance="ptc-embedded")
            store.mark_interrupted()
        self.recorder = Recorder(store, tenant=tenant)
        self._loop = _LoopThread("ptc-embedded")
        self.engine = Engine(config)
        try:
            self._loop.call(self.engine.start())
        except BaseException:
            self._loop.stop()
            self._close_store()
            raise
        self._closed = False
        self._sessions: SessionManager | None = None

    def session_manager(self) -> SessionManager:
        """The sessions of this runner's engine (`sandbox.integrations.session_runners`)."""
        if self._sessions is None:
            manager = SessionManager(self.engine, self.recorder.store)

            async def start() -> None:
                manager.start()

            self._loop.call(start())
            self._sessions = manager
        return self._sessions

    async def _execute(self, request: RunRequest) -> ExecutionResult:
        manifest, local = build_manifest(list(request.tools))
        prepared = self.engine.prepare(execution_request(request.script, manifest, request.options))
        if request.on_progress is None:
            return await self.recorder.run(
                self.engine, prepared, hooks=RunHooks(handlers={"client": _client_handler(local)})
            )
        started: list[StartedInfo] = []
        ticker = asyncio.create_task(_tick(started, request.on_progress))
        try:
            return await self.recorder.run(
                self.engine,
                prepared,
                hooks=RunHooks(
                    handlers={"client": _client_handler(local)}, on_started=started.append
                ),
            )
        finally:
            ticker.cancel()

    def _close_store(self) -> None:
        if self._owned_store is not None:
            self._owned_store.close()
            self._owned_store = None

    def run(self, request: RunRequest) -> ExecutionResult:
        return self._loop.call(self._execute(request))

    async def arun(self, request: RunRequest) -> ExecutionResult:
        return await self._loop.acall(self._execute(request))

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs ``coroutine`` on the runner's event loop, where its engine and sessions live,
        from any thread but that loop's, and returns its result."""
        return self._loop.call(coroutine)

    async def acall(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """`call` for a caller on another event loop: awaits without blocking that loop."""
        return await self._loop.acall(coroutine)

    def replay(
        self,
        execution_id: str,
        *,
        tools: Sequence[ToolLike] | None = None,
        limits: Limits | None = None,
    ) -> ReplayReport:
        """Replays one of this runner's recorded executions (`sandbox.replay`): its tool calls
        answered from the record, against ``tools`` instead of the recorded manifest when given
        (their functions are never called), ``limits`` over the recorded ones."""
        from sandbox.replay.run import replay

        store = self.recorder.store
        if store is None:
            raise InvalidArgument("replay: this runner keeps no audit store (pass audit=...)")
        manifest = build_manifest(list(tools))[0] if tools is not None else None
        return self._loop.call(
            replay(
                self.engine,
                store,
                execution_id,
                tenant=self.recorder.tenant,
                manifest=manifest,
                limits=limits,
            )
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._sessions is not None:
                self._loop.call(self._sessions.close_all("the runner closed"))
            self._loop.call(self._settle())
            self._loop.call(self.engine.close())
        finally:
            self._loop.stop()
            self._close_store()

    async def _settle(self) -> None:
        # Closing a backend while its warm pool is still starting a sandbox leaks that
        # sandbox's channel (see sandbox/backends/process/sandbox.py): let refills finish.
        for backend in self.engine.config.backends.values():
            try:
                pool = backend.pool
            except Unavailable:
                continue  # never started (a Docker backend with no engine): nothing is starting
            if pool is not None:
                await pool.wait_ready()

    def __enter__(self) -> EmbeddedRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _client_handler(local: Mapping[str, ClientTool]) -> ToolHandler:
    async def handle(call: ToolCall) -> Any:
        tool = local.get(call.tool.name)
        if tool is None:
            raise ToolFailure(f"no function serves tool {call.tool.name!r}")
        try:
            text = await tool.invoke(call.arguments)
        except ToolFailure:
            raise
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise ToolFailure(message) from exc
        return json.loads(text)

    return handle


async def _tick(started: list[StartedInfo], on_progress: Callable[[ProgressSnapshot], Any]) -> None:
    """Reports the engine's probe of a run once it is past `PROGRESS_AFTER_S`, every period."""
    await asyncio.sleep(PROGRESS_AFTER_S)
    while True:
        probe = started[0].probe if started else None
        if probe is not None:
            on_progress(probe.snapshot())
        await asyncio.sleep(PROGRESS_EVERY_S)
