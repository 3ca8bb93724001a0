"""The spans of one execution: the hooks that `Engine.run` and `Broker` call.

Each hook costs one ``None`` check when tracing is off (`sandbox.telemetry.tracing.tracer`), and
nothing of OpenTelemetry is imported then. See `sandbox.telemetry.tracing` for the span tree.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sandbox.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from sandbox.engine import PreparedExecution
    from sandbox.result import CallRecord, ExecutionResult

__all__ = ["CallTracer", "step_span", "traced_run"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
_NULL: AbstractContextManager[None] = contextlib.nullcontext()


def traced_run(run: F) -> F:
    """Wraps `Engine.run` in the execution's span, when tracing is on."""

    @functools.wraps(run)
    def wrapper(engine: Any, prepared: PreparedExecution, **kwargs: Any) -> Awaitable[Any]:
        tracer = tracing.tracer()
        if tracer is None:
            return run(engine, prepared, **kwargs)
        return _traced(tracer, run, engine, prepared, kwargs)

    return cast(F, wrapper)


async def _traced(
    tracer: Tracer,
    run: Callable[..., Awaitable[ExecutionResult]],
    engine: Any,
    prepared: PreparedExecution,
    kwargs: dict[str, Any],
) -> ExecutionResult:
    attributes: dict[str, Any] = {
        "ptc.execution_id": prepared.execution_id,
        "ptc.tenant": kwargs.get("tenant") or "default",
        "ptc.backend": prepared.backend,
        "ptc.policy": prepared.request.policy,
        "ptc.manifest_sha256": prepared.manifest.sha256,
    }
    runtime = getattr(prepared.request, "runtime", None)  # issue 14's runtimes, where present
    if runtime:
        attributes["ptc.runtime"] = str(runtime)
    with tracer.start_as_current_span("ptc.execution", attributes=attributes) as span:
        result = await run(engine, prepared, **kwargs)
        _annotate_execution(span, result)
        return result


def _annotate_execution(span: Span, result: ExecutionResult) -> None:
    from opentelemetry.trace import Status, StatusCode

    usage = result.usage
    span.set_attributes(
        {
            "ptc.status": str(result.status),
            "ptc.exit_code": result.exit_code,
            "ptc.violations": [v.limit for v in result.violations],
            "ptc.usage.wall_time_s": usage.wall_time_s,
            "ptc.usage.cpu_time_s": usage.cpu_time_s,
            "ptc.usage.peak_memory_bytes": usage.peak_memory_bytes,
            "ptc.usage.stdout_bytes": usage.stdout_bytes,
            "ptc.usage.stderr_bytes": usage.stderr_bytes,
            "ptc.usage.tool_calls": usage.tool_calls,
        }
    )
    if str(result.status) != "ok":
        detail = f"{result.error.type}: {result.error.message}" if result.error else ""
        span.set_status(Status(StatusCode.ERROR, f"{result.status}: {detail}"[:500]))


def step_span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one for one step (stub generation, sandbox acquisition)."""
    tracer = tracing.tracer()
    if tracer is None:
        return _NULL
    return tracer.start_as_current_span(name, attributes=attributes)


class CallTracer:
    """The tool-call spans of one broker: started when a call arrives (on the channel thread),
    current while its handler runs (so a host handler's spans, or a client tool's across the
    stream, are its children), ended with its outcome."""

    def __init__(self, tracer: Tracer, parent: Context) -> None:
        self._tracer = tracer
        self._parent = parent
        self._payloads = tracing.payloads()
        self._spans: dict[int, Span] = {}
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> CallTracer | None:
        """A tracer for the calls of the execution whose span is current; None when off."""
        tracer = tracing.tracer()
        if tracer is None:
            return None
        parent = tracing.current_context()
        assert parent is not None
        return cls(tracer, parent)

    def start(self, record: CallRecord) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": record.tool,
            "gen_ai.tool.call.id": record.idempotency_key,
            "ptc.tool.name": record.tool,
            "ptc.tool.seq": record.seq,
            "ptc.tool.idempotency_key": record.idempotency_key,
        }
        if self._payloads.capture and record.arguments is not None:
            attributes["ptc.tool.arguments"] = self._payloads.render(record.arguments)
        span = self._tracer.start_span(
            f"execute_tool {record.tool}", context=self._parent, attributes=attributes
        )
        with self._lock:
            self._spans[record.seq] = span

    def end(self, record: CallRecord, value: Any = None) -> None:
        with self._lock:
            span = self._spans.pop(record.seq, None)
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        status = str(record.status)
        span.set_attribute("ptc.tool.status", status)
        span.set_attribute("ptc.tool.duration_s", record.duration_s)
        if self._payloads.capture and status == "ok":
            span.set_attribute("ptc.tool.result", self._payloads.render(value))
        if status != "ok":
            span.set_status(Status(StatusCode.ERROR, f"{status}: {record.error or ''}"[:500]))
        span.end()

    @contextlib.contextmanager
    def current(self, seq: int) -> Iterator[None]:
        """The call's span is the current one for the block (its handler's)."""
        with self._lock:
            span = self._spans.get(seq)
        if span is None:
            yield
            return
        with tracing.attached(tracing.span_context(span)):
            yield

    def finish(self, records: list[CallRecord]) -> None:
        """Ends the spans of calls the execution outlived (recorded as cancelled)."""
        by_seq = {r.seq: r for r in records}
        with self._lock:
            left = list(self._spans)
        for seq in left:
            record = by_seq.get(seq)
            if record is not None:
                self.end(record)
            else:
                with self._lock:
                    span = self._spans.pop(seq, None)
                if span is not None:
                    span.set_attribute("ptc.tool.status", "cancelled")
                    span.end()
