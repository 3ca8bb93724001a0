"""Admitted executions: request checks, tenant admission, the audit record, and the run itself.

Both RPC flavours go through here. `Runner.prepare` checks every field before anything is
admitted (bad input is INVALID_ARGUMENT naming the field, a mode or backend the tenant may not use
is PERMISSION_DENIED). `Runner.start` runs the execution in its own task, so that an RPC that is
cancelled or whose client went away never interrupts the engine halfway: the RPC sets the
execution's ``cancel`` event instead, the sandbox is killed, and the record is completed as
`cancelled`. Every admitted execution is written with `admit` before it runs and `complete` after,
whatever happened. `drain` is the shutdown path: wait for in-flight runs, then stop the rest,
which are recorded as `interrupted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from sandbox.audit.base import Admission, AuditStore
from sandbox.capture import OutputCallback
from sandbox.engine import MAX_SCRIPT_BYTES, Engine, ExecutionRequest, StartedInfo
from sandbox.errors import InvalidArgument, PtcError
from sandbox.handlers import Approver, ToolHandler
from sandbox.limits import LimitAdjustment, ResolvedLimits
from sandbox.result import ExecutionResult, ExecutionStatus, ScriptError
from sandbox.server.host_handlers import HostHandlers
from sandbox.tenants.base import Tenancy, Tenant
from sandbox.tenants.policy import check_backend, check_tool_modes, effective_limits
from stubs_gen import Manifest

__all__ = ["Prepared", "Runner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A request that passed every check, ready to be admitted."""

    execution_id: str
    tenant: Tenant
    request: ExecutionRequest
    manifest: Manifest
    manifest_json: str
    limits: tuple[ResolvedLimits, list[LimitAdjustment]]
    backend: str


class Runner:
    def __init__(
        self, engine: Engine, store: AuditStore, tenancy: Tenancy, host: HostHandlers
    ) -> None:
        self.engine = engine
        self.store = store
        self.tenancy = tenancy
        self.host = host
        self._runs: dict[asyncio.Task[ExecutionResult], asyncio.Event] = {}
        self._draining = False

    def prepare(self, tenant: Tenant, request: ExecutionRequest, *, streamed: bool) -> Prepared:
        if len(request.script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
            raise InvalidArgument(f"script: larger than {MAX_SCRIPT_BYTES} bytes")
        manifest_json = request.manifest if isinstance(request.manifest, str) else "[]"
        manifest = self.engine.manifest(request)
        for index, tool in enumerate(manifest.tools):
            mode = tool.options.mode
            if mode == "client" and not streamed:
                raise InvalidArgument(
                    f"manifest: tools[{index}] {tool.name!r}: is a 'client'-mode tool, which "
                    "needs ExecuteStream (Execute serves echo, mock and host tools)"
                )
        check_tool_modes(tenant, [(tool.name, tool.options.mode) for tool in manifest.tools])
        self.host.check(manifest)
        for index, expected in enumerate(request.expected_calls):
            if manifest.tool(expected.tool) is None:
                raise InvalidArgument(
                    f"expected_calls[{index}].tool: unknown tool {expected.tool!r}"
                )
        backend = request.backend or self.engine.config.default_backend
        check_backend(tenant, backend)
        self.engine.backend(backend)  # UNAVAILABLE when this server does not have it
        limits = effective_limits(tenant, request.limits)
        return Prepared(
            execution_id=uuid.uuid4().hex,
            tenant=tenant,
            request=replace(request, manifest=manifest, backend=backend),
            manifest=manifest,
            manifest_json=manifest_json,
            limits=limits,
            backend=backend,
        )

    def start(
        self,
        prepared: Prepared,
        *,
        cancel: asyncio.Event,
        handlers: Mapping[str, ToolHandler] | None = None,
        approver: Approver | None = None,
        on_output: OutputCallback | None = None,
        on_started: Callable[[StartedInfo], None] | None = None,
    ) -> asyncio.Task[ExecutionResult]:
        task = asyncio.create_task(
            self._run(prepared, cancel, handlers, approver, on_output, on_started)
        )
        self._runs[task] = cancel
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[ExecutionResult]) -> None:
        self._runs.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so that a run whose RPC already went away is not reported as an
            # unretrieved exception; the RPC, when still there, reads it from the task.
            log.debug("execution ended with %r", task.exception())

    async def _run(
        self,
        prepared: Prepared,
        cancel: asyncio.Event,
        handlers: Mapping[str, ToolHandler] | None,
        approver: Approver | None,
        on_output: OutputCallback | None,
        on_started: Callable[[StartedInfo], None] | None,
    ) -> ExecutionResult:
        async with self.tenancy.admit(prepared.tenant):
            if cancel.is_set():  # the caller left while queued: nothing was admitted
                return _unadmitted(prepared)
            request = prepared.request
            self.store.admit(
                Admission(
                    execution_id=prepared.execution_id,
                    tenant=prepared.tenant.id,
                    script=request.script,
                    manifest_json=prepared.manifest_json,
                    manifest_sha256=prepared.manifest.sha256,
                    backend=prepared.backend,
                    policy=request.policy,
                    effective_limits=prepared.limits[0].to_json(),
                    labels=dict(request.labels),
                    admitted_at=time.time(),
                )
            )
            try:
                result = await self.engine.execute(
                    request,
                    handlers={"host": self.host, **(handlers or {})},
                    approver=approver,
                    on_output=on_output,
                    on_started=on_started,
                    cancel=cancel,
                    limits=prepared.limits,
                    execution_id=prepared.execution_id,
                )
            except BaseException as exc:
                self.store.complete(prepared.execution_id, _failed(prepared, exc))
                raise
            if self._draining and result.status == ExecutionStatus.CANCELLED:
                result.status = ExecutionStatus.INTERRUPTED  # the server stopped it
            self.store.complete(prepared.execution_id, result)
            return result

    async def drain(self, grace_s: float) -> None:
        """Lets in-flight executions finish for ``grace_s``, then cancels and awaits the rest
        (recorded as `interrupted`)."""
        self._draining = True
        runs = list(self._runs)
        if not runs:
            return
        _done, pending = await asyncio.wait(runs, timeout=grace_s)
        for task in pending:
            self._runs.get(task, asyncio.Event()).set()
        if pending:
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)


def _unadmitted(prepared: Prepared) -> ExecutionResult:
    now = time.time()
    return ExecutionResult(
        execution_id=prepared.execution_id,
        status=ExecutionStatus.CANCELLED,
        backend=prepared.backend,
        effective_limits=prepared.limits[0].to_json(),
        started_at=now,
        finished_at=now,
    )


def _failed(prepared: Prepared, exc: BaseException) -> ExecutionResult:
    """The record of an execution the engine could not finish."""
    cancelled = isinstance(exc, asyncio.CancelledError)
    message = exc.message if isinstance(exc, PtcError) else f"{type(exc).__name__}: {exc}"
    result = _unadmitted(prepared)
    result.status = ExecutionStatus.CANCELLED if cancelled else ExecutionStatus.INTERRUPTED
    result.exit_code = -1
    result.error = ScriptError(type(exc).__name__, message[:2000])
    return result
