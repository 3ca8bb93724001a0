"""Script runners bound to one session: every `run` is the session's next cell, so names,
imports and files persist from one call of an agent's execute tool to the next.

    with EmbeddedRunner() as runner, open_session(runner) as conversation:
        tool = ExecuteTool(conversation)          # one session per conversation
        executor = SandboxExecutor(conversation)  # smolagents: state persists between steps

`open_session` takes a `ClientRunner` (the session lives on the `ptc serve` server, and runs go
over ExecuteStream, so client-side tools work) or an `EmbeddedRunner` (the session lives in the
runner's engine, recorded in its audit store like the server's). Closing the session runner
closes the session; once the session has ended (idle, lifetime, lost), a run raises the
`NotFound` / `FailedPrecondition` that says why, which the execute tool shows the model.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Unpack

from sandbox.client.tools import build_manifest
from sandbox.engine import RunHooks
from sandbox.errors import FailedPrecondition, InvalidArgument, NotFound
from sandbox.integrations.runners import (
    ClientRunner,
    EmbeddedRunner,
    RunRequest,
    _client_handler,
    execution_request,
)
from sandbox.limits import Limits
from sandbox.options import SessionOptions, SessionOverrides
from sandbox.result import ExecutionResult
from sandbox.sessions.cells import cell_limits, cell_request
from sandbox.sessions.manager import Session, SessionManager, SessionSettings

__all__ = ["ClientSessionRunner", "EmbeddedSessionRunner", "open_session"]

DEFAULT_IDLE_S = 600.0
DEFAULT_LIFETIME_S = 3600.0


class ClientSessionRunner:
    """A session on a server; runs go through `Client.run` with the session's id."""

    def __init__(self, runner: ClientRunner, options: SessionOptions | None = None) -> None:
        self._runner = runner
        self._session = runner.client.session((), options)
        self._session.create()

    @property
    def session_id(self) -> str:
        return self._session.id

    def run(self, request: RunRequest) -> ExecutionResult:
        options = replace(request.options, session_id=self.session_id)
        return self._runner.client.run(
            request.script, list(request.tools), options, on_progress=request.on_progress
        )

    async def arun(self, request: RunRequest) -> ExecutionResult:
        return await asyncio.to_thread(self.run, request)

    def close(self) -> None:
        with contextlib.suppress(NotFound, FailedPrecondition):
            self._session.close()

    def __enter__(self) -> ClientSessionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedSessionRunner:
    """A session in an `EmbeddedRunner`'s engine."""

    def __init__(
        self,
        runner: EmbeddedRunner,
        options: SessionOptions | None = None,
    ) -> None:
        options = options or SessionOptions()
        if options.runtime or options.labels:
            raise InvalidArgument(
                "an embedded session takes limits, backend, idle_timeout, max_lifetime and "
                "max_executions; runtime and labels are a server's session's"
            )
        self._runner = runner
        engine = runner.engine
        self.manager: SessionManager = runner.session_manager()
        settings = SessionSettings(
            limits=engine.effective_limits(options.limits or Limits())[0],
            idle_timeout_s=_or(options.idle_timeout, DEFAULT_IDLE_S),
            max_lifetime_s=_or(options.max_lifetime, DEFAULT_LIFETIME_S),
            max_executions=options.max_executions or 0,
        )
        self.session: Session = runner.call(
            self.manager.create(
                runner.recorder.tenant,
                manifest=engine.manifest("[]"),
                manifest_json="[]",
                backend=engine.backend(options.backend).name,
                settings=settings,
            )
        )

    @property
    def session_id(self) -> str:
        return self.session.id

    async def _execute(self, request: RunRequest) -> ExecutionResult:
        runner = self._runner
        session = self.manager.usable(self.session.tenant, self.session.id)
        manifest, local = build_manifest(list(request.tools))
        options = request.options
        # The caller's labels checked as a server checks them, then the cell's own backend,
        # runtime and label, by the rules every path that runs cells follows.
        execution = cell_request(
            session,
            execution_request(request.script, manifest, options),
            manifest_given=True,  # each run brings its tools: they replace the session's
        )
        asked = options.limits or Limits()
        limits, adjustments = runner.engine.effective_limits(asked)
        limits, fixed = cell_limits(session, limits, asked)
        prepared = runner.engine.prepare(execution, limits=(limits, [*adjustments, *fixed]))
        self.manager.claim(session, prepared.execution_id)
        # A cell the audit store refuses to admit leaves the session as it was (`run_cell`).
        return await self.manager.run_cell(
            session,
            prepared.execution_id,
            prepared.manifest,
            lambda admitted: runner.recorder.run(
                runner.engine,
                prepared,
                hooks=RunHooks(handlers={"client": _client_handler(local)}),
                session=session.sandbox,
                on_admitted=admitted,
            ),
        )

    def run(self, request: RunRequest) -> ExecutionResult:
        return self._runner.call(self._execute(request))

    async def arun(self, request: RunRequest) -> ExecutionResult:
        return await self._runner.acall(self._execute(request))

    def close(self) -> None:
        with contextlib.suppress(NotFound, FailedPrecondition):
            self._runner.call(self.manager.close(self.session.tenant, self.session.id))

    def __enter__(self) -> EmbeddedSessionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(
    runner: ClientRunner | EmbeddedRunner,
    options: SessionOptions | None = None,
    **overrides: Unpack[SessionOverrides],
) -> ClientSessionRunner | EmbeddedSessionRunner:
    """A runner bound to a new session of ``runner``'s server or engine, created with
    ``options`` (`SessionOptions`: ``limits`` (the session's), ``backend``, ``idle_timeout``,
    ``max_lifetime`` (seconds), ``max_executions``) or the same names as keywords."""
    chosen = SessionOptions.of(options, **overrides)
    if isinstance(runner, ClientRunner):
        return ClientSessionRunner(runner, chosen)
    return EmbeddedSessionRunner(runner, chosen)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
