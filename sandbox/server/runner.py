"""Admitted executions: request checks, tenant admission, the audit record, and the run itself.

Both RPC flavours go through here. `Runner.prepare` checks every field before anything is
admitted (bad input is INVALID_ARGUMENT naming the field, a mode or backend the tenant may not use
is PERMISSION_DENIED), the engine's checks through `Engine.prepare` with the tenant's effective
limits. `Runner.start` runs the execution in its own task, so that an RPC that is cancelled or
whose client went away never interrupts the engine halfway: the RPC sets the execution's
``cancel`` event instead, the sandbox is killed, and the record is completed as `cancelled`.
An execution still queued for its tenant's slot when ``cancel`` is set leaves the queue at once
(`fleet.admit_unless_cancelled`) and ends `cancelled` with nothing admitted.
Every admitted execution is recorded by `sandbox.recording.Recorder`: `admit` before it runs,
`complete` (or `failed`) after, whatever happened. `drain` is the shutdown path: wait for
in-flight runs, then stop the rest, which are recorded as `interrupted`; ``refusing`` (set when
the server starts to stop) turns new requests away with `Unavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from sandbox.audit.base import AuditStore
from sandbox.engine import Engine, ExecutionRequest, PreparedExecution
from sandbox.errors import FailedPrecondition, InvalidArgument, Unavailable
from sandbox.execution.hooks import NO_HOOKS, RunHooks
from sandbox.recording import Recorder
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.runtimes import RuntimeStore
from sandbox.server.fleet import admit_unless_cancelled
from sandbox.server.host_handlers import HostHandlers
from sandbox.sessions.cells import cell_limits
from sandbox.sessions.manager import Session, SessionManager
from sandbox.sessions.rebuild import RebuildBounds
from sandbox.telemetry import metrics
from sandbox.tenants.base import Tenancy, Tenant
from sandbox.tenants.policy import (
    check_backend,
    check_runtime,
    check_tool_modes,
    effective_limits,
)

__all__ = ["Prepared", "Runner", "rebuild_bounds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check, the server's and the engine's, ready to be admitted."""

    tenant: Tenant
    execution: PreparedExecution
    session: Session | None = None  # run as the next cell of this session

    @property
    def execution_id(self) -> str:
        return self.execution.execution_id


class Runner:
    def __init__(
        self,
        engine: Engine,
        store: AuditStore,
        tenancy: Tenancy,
        host: HostHandlers,
        runtimes: RuntimeStore | None = None,
    ) -> None:
        self.engine = engine
        # The runtimes the backends run (the server's `runtimes_dir`): whether one a tenant
        # names is built at all (NOT_FOUND) is told apart from whether it may use it.
        self.runtimes = runtimes or RuntimeStore()
        self.store = store
        self.recorder = Recorder(store)
        self.tenancy = tenancy
        self.host = host
        self._runs: dict[asyncio.Task[ExecutionResult], asyncio.Event] = {}
        self._draining = False
        self._hurry = asyncio.Event()  # set: the drain's grace ends now (a second signal)
        self.sessions = SessionManager(engine, store)
        self.refusing: str | None = None  # set at shutdown: new executions get UNAVAILABLE

    def prepare(
        self,
        tenant: Tenant,
        request: ExecutionRequest,
        *,
        streamed: bool,
        session: Session | None = None,
    ) -> Prepared:
        """The server's checks (tool modes, host handlers, the tenant's backends), then the
        engine's (`Engine.prepare`) with the tenant's effective limits."""
        if self.refusing is not None:
            if session is not None and not self.store.holds_sessions:
                # It ends with this server: no other server can take it.
                raise FailedPrecondition(
                    f"session_lost: session {session.id!r} is ending: the server that holds it"
                    " is shutting down"
                )
            # With a store that moves sessions, the drain hands this one over: another server
            # (or this one restarted) rebuilds it on its next call, so "retry elsewhere" holds.
            raise Unavailable(self.refusing)
        manifest = self.engine.manifest(request)  # cached: `Engine.prepare` parses it no more
        for index, tool in enumerate(manifest.tools):
            mode = tool.options.mode
            if mode == "client" and not streamed:
                raise InvalidArgument(
                    f"manifest: tools[{index}] {tool.name!r}: is a 'client'-mode tool, which "
                    "needs ExecuteStream (Execute serves echo, mock and host tools)"
                )
        check_tool_modes(tenant, [(tool.name, tool.options.mode) for tool in manifest.tools])
        self.host.check(manifest)
        check_backend(tenant, request.backend or self.engine.config.default_backend)
        check_runtime(tenant, request.runtime, self.runtimes.exists)
        limits, adjustments = effective_limits(tenant, request.limits)
        if session is not None:
            limits, fixed = cell_limits(session, limits, request.limits)
            adjustments = [*adjustments, *fixed]
        execution = self.engine.prepare(request, limits=(limits, adjustments))
        return Prepared(tenant, execution, session)

    def start(
        self,
        prepared: Prepared,
        hooks: RunHooks = NO_HOOKS,
    ) -> asyncio.Task[ExecutionResult]:
        """Runs ``prepared`` in a task, calling ``hooks``; setting ``hooks.cancel`` stops it
        (a run without one gets its own: the drain sets it)."""
        if self.refusing is not None:  # also for paths that skip `prepare` (a replay)
            raise Unavailable(self.refusing)
        if prepared.session is not None:
            self.sessions.claim(prepared.session, prepared.execution_id)  # refuses a busy one
        cancel = hooks.cancel or asyncio.Event()
        hooks = replace(hooks.with_handlers({"host": self.host}), cancel=cancel)
        task = asyncio.create_task(self._run(prepared, hooks))
        self._runs[task] = cancel
        task.add_done_callback(self._finished)
        return task

    @property
    def in_flight(self) -> int:
        """Executions started and not yet finished (running or queued for their tenant)."""
        return len(self._runs)

    def _finished(self, task: asyncio.Task[ExecutionResult]) -> None:
        self._runs.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so that a run whose RPC already went away is not reported as an
            # unretrieved exception; the RPC, when still there, reads it from the task.
            log.debug("execution ended with %r", task.exception())

    async def _run(self, prepared: Prepared, hooks: RunHooks) -> ExecutionResult:
        session = prepared.session
        if session is None:
            return await self._admitted(prepared, hooks)
        # Refused before its admission, the session is untouched; after it, the cell's own
        # result or error decides (`SessionManager.run_cell`).
        return await self.sessions.run_cell(
            session,
            prepared.execution_id,
            prepared.execution.manifest,
            lambda admitted: self._admitted(prepared, hooks, admitted),
        )

    async def _admitted(
        self,
        prepared: Prepared,
        hooks: RunHooks,
        on_admitted: Callable[[], None] | None = None,
    ) -> ExecutionResult:
        cancel = hooks.cancel or asyncio.Event()  # never None: `start` gives each run one
        queued = time.monotonic()
        state = "queued"
        metrics.in_flight(state, +1)
        try:
            async with admit_unless_cancelled(self.tenancy.admit(prepared.tenant), cancel):
                metrics.queue_wait(prepared.tenant.id, time.monotonic() - queued)
                if cancel.is_set():  # the caller left while queued: nothing was admitted
                    return _unadmitted(prepared)
                metrics.in_flight(state, -1)
                state = "admitted"
                metrics.in_flight(state, +1)
                return await self.recorder.run(
                    self.engine,
                    prepared.execution,
                    tenant=prepared.tenant.id,
                    stopping=lambda: self._draining,
                    hooks=hooks,
                    session=prepared.session.sandbox if prepared.session is not None else None,
                    on_admitted=on_admitted,
                )
        finally:
            metrics.in_flight(state, -1)

    def hurry(self) -> int:
        """Ends the drain's grace now (a second SIGTERM or Ctrl-C): the executions still
        held are stopped (running ones recorded `interrupted`, queued ones never ran). Returns how
        many it holds."""
        self._hurry.set()
        return len(self._runs)

    async def drain(self, grace_s: float) -> None:
        """Lets in-flight executions finish for ``grace_s``, then cancels and awaits the rest
        (recorded as `interrupted`)."""
        self._draining = True
        runs = list(self._runs)
        if not runs:
            await self.sessions.release_all("server stopping: sessions end with the server")
            return
        # Until every run ends, the grace passes or `hurry` cuts it short (asyncio.wait never
        # cancels what it waits for: the runs go on until they are cancelled below).
        ended = asyncio.ensure_future(asyncio.wait(runs))
        hurried = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait(
                (ended, hurried), timeout=grace_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            ended.cancel()
            hurried.cancel()
        pending = [task for task in runs if not task.done()]
        for task in pending:
            self._runs.get(task, asyncio.Event()).set()
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
        await self.sessions.release_all("server stopping: sessions end with the server")


def rebuild_bounds(tenant: Tenant) -> RebuildBounds:
    """What rebuilding one of ``tenant``'s sessions on this server may spend."""
    return RebuildBounds(tenant.session_rebuild_max_cells, tenant.session_rebuild_max_cpu_s)


def _unadmitted(prepared: Prepared) -> ExecutionResult:
    now = time.time()
    return ExecutionResult(
        execution_id=prepared.execution_id,
        status=ExecutionStatus.CANCELLED,
        backend=prepared.execution.backend,
        effective_limits=prepared.execution.limits,
        adjustments=list(prepared.execution.adjustments),
        started_at=now,
        finished_at=now,
    )
