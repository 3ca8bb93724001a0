"""The spans of one execution: the hooks that `Engine.run` and `Broker` call.

Each hook costs one ``None`` check when tracing is off (`sandbox.telemetry.tracing.tracer`), and
nothing of OpenTelemetry is imported then. See `sandbox.telemetry.tracing` for the span tree.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sandbox.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from sandbox.engine import PreparedExecution
    from sandbox.handlers import ToolCall
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
    """The tool-call spans of one broker.

    A call answered at once on the channel thread (an echo or mock tool) is only timed there
    (two clock reads): its span is made when the execution's calls are finished, with those
    times, so that tracing adds nothing to the round trip the script waits for. A call that
    waits for a handler gets its span when it is dispatched: that span is current while the
    handler runs, so a host handler's spans, or a client tool's across the gRPC stream, are its
    children. Either way a call's span starts when the call arrived and ends with its outcome.
    """

    def __init__(self, tracer: Tracer, parent: Context) -> None:
        self._tracer = tracer
        self._parent = parent
        self._payloads = tracing.payloads()
        self._arrived: dict[int, int] = {}  # seq → arrival (ns since the epoch)
        self._spans: dict[int, Span] = {}  # calls being dispatched
        self._done: list[tuple[CallRecord, int, int, Any]] = []  # answered at once
        self._finished = False
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
        arrived = time.time_ns()
        with self._lock:
            self._arrived[record.seq] = arrived

    def end(self, record: CallRecord, value: Any = None) -> None:
        ended = time.time_ns()
        with self._lock:
            if self._finished:  # an answer after the execution ended: its span is closed
                return
            span = self._spans.pop(record.seq, None)
            arrived = self._arrived.pop(record.seq, ended)
            if span is None:
                self._done.append((record, arrived, ended, value))
                return
        self._close(span, record, value, ended)

    def _open(self, tool: str, seq: int, key: str, arguments: Any, arrived: int) -> Span:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": key,
            "ptc.tool.name": tool,
            "ptc.tool.seq": seq,
            "ptc.tool.idempotency_key": key,
        }
        if self._payloads.capture and arguments is not None:
            attributes["ptc.tool.arguments"] = self._payloads.render(arguments)
        return self._tracer.start_span(
            f"execute_tool {tool}",
            context=self._parent,
            attributes=attributes,
            start_time=arrived,
        )

    def _close(self, span: Span, record: CallRecord, value: Any, ended: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        status = str(record.status)
        span.set_attribute("ptc.tool.status", status)
        span.set_attribute("ptc.tool.duration_s", record.duration_s)
        if self._payloads.capture and status == "ok":
            span.set_attribute("ptc.tool.result", self._payloads.render(value))
        if status != "ok":
            span.set_status(Status(StatusCode.ERROR, f"{status}: {record.error or ''}"[:500]))
        span.end(end_time=ended)

    @contextlib.contextmanager
    def current(self, call: ToolCall) -> Iterator[None]:
        """The call's span, opened now, is the current one for the block (its handler's)."""
        with self._lock:
            arrived = self._arrived.get(call.seq)
        if arrived is None:  # already answered
            yield
            return
        span = self._open(call.tool.name, call.seq, call.idempotency_key, call.arguments, arrived)
        with self._lock:
            self._spans[call.seq] = span
        with tracing.attached(tracing.span_context(span)):
            yield

    def finish(self, records: list[CallRecord]) -> None:
        """Makes the spans of the calls answered at once, and ends those of calls the
        execution outlived (recorded as cancelled)."""
        with self._lock:
            self._finished = True
            done, self._done = self._done, []
            open_spans, self._spans = self._spans, {}
            waiting, self._arrived = self._arrived, {}
        for record, arrived, ended, value in done:
            self._close(self._opened(record, arrived), record, value, ended)
        now = time.time_ns()
        by_seq = {r.seq: r for r in records}
        for seq, span in open_spans.items():
            found = by_seq.get(seq)
            span.set_attribute("ptc.tool.status", str(found.status) if found else "cancelled")
            span.end(end_time=now)
        for seq, arrived in waiting.items():
            found = by_seq.get(seq)
            if seq not in open_spans and found is not None:
                self._close(self._opened(found, arrived), found, None, now)

    def _opened(self, record: CallRecord, arrived: int) -> Span:
        return self._open(
            record.tool, record.seq, record.idempotency_key, record.arguments, arrived
        )
