"""The embedded API: one call runs one execution end to end, with no server.

    engine = Engine(EngineConfig())
    await engine.start()
    result = await engine.execute(ExecutionRequest(script="print(1)", manifest="[]"))

One execution is two steps. `Engine.prepare` validates the request once (script size, manifest,
expected calls, backend, syntax and policy) and resolves its effective limits once, into a
`PreparedExecution`; `Engine.run` runs that — stubs (cached by manifest hash) → a sandbox from
the backend's warm pool → broker → the drive loop → result — and checks nothing again.
`Engine.execute` is the two together. The gRPC server, the CLI, the integrations and the
benchmarks all go through `run`, and those that keep an audit record wrap it in
`sandbox.recording.Recorder`.

This module is the façade over the execution wing (`sandbox.execution`): the request types,
the drive loop, the evidence rules and result assembly (with its status rules) live there.
"""

from __future__ import annotations

# First: the process backend's package turns gRPC's fork handlers off before a program that
# runs sandboxes starts gRPC (sandbox/backends/process/__init__.py says why).
import sandbox.backends.process  # noqa: F401  # isort: skip

import ast
import hashlib
import json
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sandbox.backends.base import Backend, Job
from sandbox.errors import InvalidArgument, InvalidManifest, Unavailable
from sandbox.execution import assemble
from sandbox.execution.acquire import acquire_sandbox
from sandbox.execution.broker import Broker
from sandbox.execution.cell import SessionSandbox
from sandbox.execution.hooks import NO_HOOKS, RunHooks
from sandbox.execution.place import Place, SessionCell, SingleUse
from sandbox.execution.request import ExecutionRequest, PreparedExecution, StartedInfo
from sandbox.files import check_inputs
from sandbox.handlers import ToolHandler, builtin_handlers
from sandbox.limits import (
    CEILINGS,
    DEFAULTS,
    LimitAdjustment,
    Limits,
    ResolvedLimits,
    apply_ceilings,
)
from sandbox.request_caps import SESSION_LABEL, check_labels, check_manifest_size, check_script_size
from sandbox.restricted import check_restricted
from sandbox.result import ExecutionResult, ScriptError
from sandbox.telemetry.progress import LiveProbe
from sandbox.telemetry.spans import step_span, traced_run
from stubs_gen import Manifest, ManifestError, load_manifest, render_module

__all__ = [
    "Engine",
    "EngineConfig",
    "ExecutionRequest",
    "PreparedExecution",
    "RunHooks",
    "StartedInfo",
    "acquire_sandbox",
    "check_runtime",
]

CACHE_SIZE = 256


@dataclass
class EngineConfig:
    backends: dict[str, Backend] = field(default_factory=dict)
    default_backend: str = "process"
    defaults: ResolvedLimits = DEFAULTS
    ceilings: ResolvedLimits = CEILINGS
    ceiling_policy: Literal["clamp", "refuse"] = "clamp"
    handlers: dict[str, ToolHandler] = field(default_factory=builtin_handlers)
    max_call_bytes: int = 1 << 20


class Engine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        if not self.config.backends:
            from sandbox.backends.factory import build_backend

            self.config.backends["process"] = build_backend("process")
        self._stubs: dict[str, str] = {}
        self._manifests: dict[str, Manifest] = {}

    async def start(self) -> None:
        for backend in self.config.backends.values():
            await backend.start()

    async def close(self) -> None:
        for backend in self.config.backends.values():
            await backend.close()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- pieces --------------------------------------------------------------------------------
    def manifest(self, source: ExecutionRequest | Any) -> Manifest:
        raw = source.manifest if isinstance(source, ExecutionRequest) else source
        if isinstance(raw, Manifest):
            return raw
        if isinstance(raw, (str, bytes)):
            check_manifest_size(raw)
        # Cached by input text: a Manifest caches its compiled validators, so a repeated
        # manifest costs neither parsing nor validator construction again.
        text = raw if isinstance(raw, (str, bytes)) else json.dumps(raw, sort_keys=True)
        key = hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()
        manifest = self._manifests.get(key)
        if manifest is None:
            try:
                manifest = load_manifest(raw)
                manifest.prepare_validators()
            except ManifestError as exc:
                raise InvalidManifest(f"manifest: {exc}") from exc
            if len(self._manifests) >= CACHE_SIZE:
                self._manifests.pop(next(iter(self._manifests)))
            self._manifests[key] = manifest
        return manifest

    def stubs(self, manifest: Manifest) -> str:
        module = self._stubs.get(manifest.sha256)
        if module is None:  # generated once per manifest: a span for the generation only
            with step_span("ptc.stubs.generate", **{"ptc.manifest_sha256": manifest.sha256}):
                module = render_module(manifest)
            if len(self._stubs) >= CACHE_SIZE:
                self._stubs.pop(next(iter(self._stubs)))
            self._stubs[manifest.sha256] = module
        return module

    def effective_limits(self, limits: Limits) -> tuple[ResolvedLimits, list[LimitAdjustment]]:
        """The request's limits under this engine's defaults and ceilings (a server passes its
        tenant's instead, through `sandbox.tenants.policy.effective_limits`)."""
        return apply_ceilings(
            limits, self.config.defaults, self.config.ceilings, self.config.ceiling_policy
        )

    def backend(self, name: str | None) -> Backend:
        key = name or self.config.default_backend
        backend = self.config.backends.get(key)
        if backend is None:
            known = ", ".join(sorted(self.config.backends)) or "none"
            raise Unavailable(f"backend {key!r} is not available on this server (have: {known})")
        return backend

    # -- the whole flow --------------------------------------------------------------------
    def prepare(
        self,
        request: ExecutionRequest,
        *,
        limits: tuple[ResolvedLimits, Sequence[LimitAdjustment]] | None = None,
        execution_id: str | None = None,
    ) -> PreparedExecution:
        """Checks ``request`` once and resolves its limits once; raises `InvalidArgument` (or
        `Unavailable` for a backend this engine does not have). ``limits`` are effective limits
        resolved by the caller (a server passes its tenant's); by default the engine's own."""
        check_script_size(request.script)
        check_labels(request.labels, reserved_ok=True)  # a server's own keys are not counted
        manifest = self.manifest(request)
        for index, expected in enumerate(request.expected_calls):
            if manifest.tool(expected.tool) is None:
                raise InvalidArgument(
                    f"expected_calls[{index}].tool: unknown tool {expected.tool!r}"
                )
        backend = self.backend(request.backend).name
        runtime = check_runtime(self.backend(backend), request.runtime)
        effective, adjustments = limits or self.effective_limits(request.limits)
        check_inputs(request.files, effective)
        return PreparedExecution(
            execution_id=execution_id or uuid.uuid4().hex,
            request=replace(request, manifest=manifest, backend=backend),
            manifest=manifest,
            manifest_json=_manifest_text(request.manifest),
            backend=backend,
            limits=effective,
            adjustments=tuple(adjustments),
            rejection=_check_script(request.script, request.policy),
            runtime=runtime,
        )

    async def execute(
        self,
        request: ExecutionRequest,
        *,
        hooks: RunHooks = NO_HOOKS,
        limits: tuple[ResolvedLimits, Sequence[LimitAdjustment]] | None = None,
        execution_id: str | None = None,
    ) -> ExecutionResult:
        """`prepare` then `run`: invalid requests raise, a failing script is a result."""
        prepared = self.prepare(request, limits=limits, execution_id=execution_id)
        return await self.run(prepared, hooks=hooks)

    @traced_run
    async def run(
        self,
        prepared: PreparedExecution,
        *,
        hooks: RunHooks = NO_HOOKS,
        session: SessionSandbox | None = None,
        tenant: str | None = None,
    ) -> ExecutionResult:
        """Runs a prepared execution to its result, calling ``hooks``; nothing is checked
        again. With ``session`` it runs as the next cell of that session's sandbox
        (`sandbox.sessions`), not in a fresh single-use one. ``tenant`` names who runs it, for
        its trace span (`sandbox.telemetry`)."""
        request, effective = prepared.request, prepared.limits
        backend = self.backend(prepared.backend)
        place: Place
        if session is None:
            place = SingleUse(backend, effective, prepared.runtime, hooks)
        else:
            session_id = request.labels.get(SESSION_LABEL, "")
            place = SessionCell(session, session_id, prepared.manifest.sha256, hooks)
        result = assemble.start(prepared, backend.name, place.session_id)
        if prepared.rejection is not None:
            return assemble.rejected(result, prepared.rejection)
        stubs = self.stubs(prepared.manifest)
        handle = await place.take()
        if handle is None:
            return assemble.cancelled_before_start(result)
        result.isolation = list(handle.isolation)
        probe = LiveProbe(handle)
        if hooks.on_started is not None:
            hooks.on_started(StartedInfo(prepared.execution_id, effective, result.isolation, probe))
        probe.broker = broker = self._broker(prepared, hooks)
        job = Job(
            prepared.execution_id,
            request.script,
            stubs,
            effective,
            self.config.max_call_bytes,
            request.files,
        )
        outcome, result.session_lost = await place.drive(handle, job, broker)
        in_session = place.session_id is not None
        return assemble.finish(
            result, outcome, broker, request.expected_calls, in_session=in_session
        )

    def _broker(self, prepared: PreparedExecution, hooks: RunHooks) -> Broker:
        """The execution's broker: the engine's handlers, then the caller's."""
        return Broker(
            prepared.execution_id,
            prepared.manifest,
            prepared.limits,
            hooks.with_handlers(self.config.handlers).handlers,
            hooks.approver,
            self.config.max_call_bytes,
        )


def _manifest_text(raw: object) -> str:
    """The manifest as the audit record keeps it: the text as given, or canonical JSON."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    if isinstance(raw, Manifest):
        return ""  # parsed by the caller; its hash still identifies it
    return json.dumps(raw, sort_keys=True, ensure_ascii=False)


_TOP_LEVEL_AWAIT = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _check_script(script: str, policy: str) -> ScriptError | None:
    """Syntax (and, for `restricted`, policy) checks made before any sandbox is taken."""
    try:
        # A full compile, not just a parse: `return` or `break` outside their blocks are only
        # found by the compiler. Warnings (e.g. invalid escapes) are the guest's to print.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(script, "<script>", "exec", _TOP_LEVEL_AWAIT, dont_inherit=True)
    except SyntaxError as exc:
        return ScriptError("SyntaxError", exc.msg or "invalid syntax", exc.lineno or 0)
    except ValueError as exc:  # e.g. a NUL byte in the source
        return ScriptError("SyntaxError", str(exc), 0)
    if policy == "restricted":
        return check_restricted(script)
    return None


def check_runtime(backend: Backend, runtime: str | None) -> str | None:
    """The request's runtime when ``backend`` can run it (None for the standard library); a
    clear error otherwise, before any sandbox is taken."""
    if not runtime:
        return None
    from sandbox.runtimes import DEFAULT_RUNTIME, validate_name

    if runtime == DEFAULT_RUNTIME:
        return None
    validate_name(runtime)
    if not backend.capabilities.runtimes:
        raise InvalidArgument(f"runtime: the {backend.name} backend does not support runtimes")
    backend.check_runtime(runtime)
    return runtime
