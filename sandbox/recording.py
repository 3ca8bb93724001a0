"""`Recorder`: the one place that writes an execution to the audit store.

Every caller that keeps audit records — the gRPC server, `ptc run --audit-db`, `ptc mcp` and the
integrations' `EmbeddedRunner` — runs its prepared executions through `Recorder.run`:

    admit(prepared)            durable before the script runs (status `running`)
    result = engine.run(...)
    complete(result)           the result, every call and violation
      or, when the engine raised,
    failed(exc)                a record that says how it ended and why, then the error goes on

Both writes are synchronous calls on the caller's thread (the server's event loop), each one
transaction of the store: the admission is committed before `Engine.run` is called, so nothing
runs unrecorded, and the completion before the result is returned (a completion the server's
store refuses is kept and written later: `sandbox.server.audit_writes`). What "committed"
survives is the store's: a SQLite file in WAL mode with ``synchronous=NORMAL`` survives a crash
of the process, not a power loss.

So every admitted execution leaves a finished record whatever happened to it: `failed` for
an error of the service (a backend that could not give a sandbox, a broken engine), `cancelled`
when the task running it was cancelled, `interrupted` when the process is stopping (Ctrl-C, a
draining server). A recorder without a store runs the execution and records nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sandbox.audit.base import Admission, AuditStore
from sandbox.engine import Engine, PreparedExecution
from sandbox.errors import PtcError
from sandbox.execution.cell import SessionSandbox
from sandbox.execution.hooks import NO_HOOKS, RunHooks
from sandbox.request_caps import SESSION_LABEL
from sandbox.result import ExecutionResult, ExecutionStatus, ScriptError
from sandbox.telemetry import metrics

__all__ = ["Recorder", "failed_result"]


class Recorder:
    """Admits, then completes or fails, each execution it runs, in ``store`` (if any)."""

    def __init__(self, store: AuditStore | None, *, tenant: str = "default") -> None:
        self.store = store
        self.tenant = tenant

    def admit(self, prepared: PreparedExecution, *, tenant: str | None = None) -> None:
        if self.store is None:
            return
        request = prepared.request
        started = time.monotonic()
        self.store.admit(
            Admission(
                execution_id=prepared.execution_id,
                tenant=tenant or self.tenant,
                script=request.script,
                manifest_json=prepared.manifest_json,
                manifest_sha256=prepared.manifest.sha256,
                backend=prepared.backend,
                policy=request.policy,
                effective_limits=prepared.limits,
                labels=dict(request.labels),
                admitted_at=time.time(),
                expected_calls=tuple(request.expected_calls),
                replay_of=request.replay_of,
                runtime=prepared.runtime or "",
                idempotency_key=request.idempotency_key,
            )
        )
        metrics.audit_write("admit", time.monotonic() - started)

    def complete(self, prepared: PreparedExecution, result: ExecutionResult) -> None:
        if self.store is not None:
            started = time.monotonic()
            self.store.complete(prepared.execution_id, result)
            metrics.audit_write("complete", time.monotonic() - started)

    def failed(
        self, prepared: PreparedExecution, exc: BaseException, *, stopping: bool = False
    ) -> ExecutionResult:
        """Completes the record of an execution the engine could not finish; returns it."""
        result = failed_result(prepared, exc, stopping=stopping)
        self.complete(prepared, result)
        return result

    async def run(
        self,
        engine: Engine,
        prepared: PreparedExecution,
        *,
        tenant: str | None = None,
        stopping: Callable[[], bool] | None = None,
        hooks: RunHooks = NO_HOOKS,
        session: SessionSandbox | None = None,
        on_admitted: Callable[[], None] | None = None,
    ) -> ExecutionResult:
        """Admits ``prepared``, runs it on ``engine`` with ``hooks`` and completes its record.
        ``stopping`` says whether the host is shutting down: a run it cancelled is then
        `interrupted`.
        ``on_admitted`` is called once the admission is durable, before the engine runs: an
        error raised before it is a refusal (nothing was admitted, nothing ran), one raised
        after it is the run's (a session's cell uses the difference: `SessionManager.finish`)."""
        self.admit(prepared, tenant=tenant)
        if on_admitted is not None:
            on_admitted()
        metrics.execution_started(prepared.backend)
        try:
            result = await engine.run(
                prepared,
                hooks=hooks,
                session=session,
                tenant=tenant or self.tenant,
            )
        except BaseException as exc:
            failed = self.failed(prepared, exc, stopping=stopping is not None and stopping())
            metrics.execution_finished(tenant or self.tenant, failed, prepared.manifest)
            raise
        if result.status == ExecutionStatus.CANCELLED and stopping is not None and stopping():
            result.status = ExecutionStatus.INTERRUPTED  # the host stopped it, not the caller
        self.complete(prepared, result)
        metrics.execution_finished(tenant or self.tenant, result, prepared.manifest)
        return result


def failed_result(
    prepared: PreparedExecution, exc: BaseException, *, stopping: bool = False
) -> ExecutionResult:
    """The result of an execution that ended with ``exc`` instead of a result."""
    if stopping or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        status = ExecutionStatus.INTERRUPTED
    elif isinstance(exc, asyncio.CancelledError):
        status = ExecutionStatus.CANCELLED
    else:
        status = ExecutionStatus.FAILED
    message = exc.message if isinstance(exc, PtcError) else str(exc)
    now = time.time()
    session_id = prepared.request.labels.get(SESSION_LABEL, "")
    return ExecutionResult(
        session_id=session_id,
        execution_id=prepared.execution_id,
        status=status,
        exit_code=-1,
        backend=prepared.backend,
        effective_limits=prepared.limits,
        adjustments=list(prepared.adjustments),
        error=ScriptError(type(exc).__name__, message[:2000]),
        started_at=now,
        finished_at=now,
    )
