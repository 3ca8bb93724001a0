"""The spans of one execution: the hooks that `Engine.run` and `Broker` call.

Each hook costs one ``None`` check when tracing is off (`sandbox.telemetry.tracing.tracer`), and
nothing of OpenTelemetry is imported then. See `sandbox.telemetry.tracing` for the span tree.

When tracing is on, the execution's span is opened when it starts (it is the parent that tool
handlers and client tools see), and everything else is kept off the path to the result: a step
(stub generation, sandbox acquisition) and a call answered at once are only timed while the
execution runs (two clock reads each), and their spans, with those times, are made together with
the execution span's end in one callback the event loop runs just after the result is returned.
A call that waits for a handler gets its span when it is dispatched (see `CallTracer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from sandbox.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from sandbox.handlers import ToolCall
    from sandbox.result import CallRecord, ExecutionResult

__all__ = ["CallTracer", "TracedExecution", "step_span", "traced_run"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
_NULL: AbstractContextManager[None] = contextlib.nullcontext()
log = logging.getLogger(__name__)


class _Deferred:
    """The spans of one execution still to be made: (name, attributes, start ns, end ns), and
    the calls answered at once (from its `CallTracer`)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, dict[str, Any], int, int]] = []
        self.calls: list[Callable[[], None]] = []


_DEFERRED: contextvars.ContextVar[_Deferred | None] = contextvars.ContextVar(
    "ptc_deferred_spans", default=None
)


class _Hashed(Protocol):
    @property
    def sha256(self) -> str: ...


class TracedExecution(Protocol):
    """What the execution's span says of it (a prepared execution)."""

    @property
    def execution_id(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def manifest(self) -> _Hashed: ...

    @property
    def request(self) -> object: ...


def traced_run(run: F) -> F:
    """Wraps `Engine.run` in the execution's span, when tracing is on."""

    @functools.wraps(run)
    def wrapper(engine: Any, prepared: TracedExecution, **kwargs: Any) -> Awaitable[Any]:
        tracer = tracing.tracer()
        if tracer is None:
            return run(engine, prepared, **kwargs)
        return _traced(tracer, run, engine, prepared, kwargs)

    return cast(F, wrapper)


async def _traced(
    tracer: Tracer,
    run: Callable[..., Awaitable[ExecutionResult]],
    engine: Any,
    prepared: TracedExecution,
    kwargs: dict[str, Any],
) -> ExecutionResult:
    from opentelemetry import context, trace

    attributes: dict[str, Any] = {
        "ptc.execution_id": prepared.execution_id,
        "ptc.tenant": kwargs.get("tenant") or "default",
        "ptc.backend": prepared.backend,
        "ptc.manifest_sha256": prepared.manifest.sha256,
    }
    runtime = getattr(
        prepared.request, "runtime", None
    )  # a runtime's name, where the request has one
    if runtime:
        attributes["ptc.runtime"] = str(runtime)
    span = tracer.start_span("ptc.execution", attributes=attributes)
    parent = trace.set_span_in_context(span)
    deferred = _Deferred()
    token = context.attach(parent)
    deferred_token = _DEFERRED.set(deferred)
    try:
        result = await run(engine, prepared, **kwargs)
    except BaseException as exc:
        _DEFERRED.reset(deferred_token)
        context.detach(token)
        _flush(tracer, parent, deferred)
        if isinstance(exc, Exception):
            span.record_exception(exc)
        _fail(span, f"{type(exc).__name__}: {exc}")
        span.end()
        raise
    _DEFERRED.reset(deferred_token)
    context.detach(token)
    ended = time.time_ns()
    asyncio.get_running_loop().call_soon(_finish, tracer, parent, deferred, span, result, ended)
    return result


# Spans made per turn of the event loop after an execution's result (~50 us each). All at once,
# the 2000 of an execution of 2000 calls held the loop, and with it the GIL, for ~100 ms: the
# channel threads of the executions running meanwhile waited for the GIL on every call (echo
# round trip +8-13%, bench.tracing). Between turns the loop's select() lets them have it.
SPANS_PER_TURN = 16


def _finish(
    tracer: Tracer,
    parent: Context,
    deferred: _Deferred,
    span: Span,
    result: ExecutionResult,
    ended: int,
) -> None:
    """The deferred half of an execution's spans, run by the loop after the result went out,
    `SPANS_PER_TURN` at a time; the execution's span ends with the last of them."""
    try:
        if _flush(tracer, parent, deferred, SPANS_PER_TURN):
            asyncio.get_running_loop().call_soon(
                _finish, tracer, parent, deferred, span, result, ended
            )
            return
        _annotate_execution(span, result)
    except Exception:  # telemetry never breaks the service; say so, once per execution
        log.exception("tracing: the spans of execution %s are incomplete", result.execution_id)
    span.end(end_time=ended)


def _flush(tracer: Tracer, parent: Context, deferred: _Deferred, most: int | None = None) -> bool:
    """Makes the deferred spans (at most ``most`` of them); True while some are left."""
    budget = len(deferred.steps) + len(deferred.calls) if most is None else most
    steps = deferred.steps[:budget]
    del deferred.steps[:budget]
    for name, attributes, started, ended in steps:
        tracer.start_span(name, context=parent, attributes=attributes, start_time=started).end(
            end_time=ended
        )
    calls = deferred.calls[: budget - len(steps)]
    del deferred.calls[: len(calls)]
    for make in calls:
        make()
    return bool(deferred.steps or deferred.calls)


def _fail(span: Span, description: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description[:500]))


def _annotate_execution(span: Span, result: ExecutionResult) -> None:
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
        _fail(span, f"{result.status}: {detail}")


def step_span(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A child span of the current one for one step (stub generation, sandbox acquisition):
    inside a traced execution only timed now and made after its result; elsewhere a span."""
    tracer = tracing.tracer()
    if tracer is None:
        return _NULL
    deferred = _DEFERRED.get()
    if deferred is None:
        return tracer.start_as_current_span(name, attributes=attributes)
    return _timed(deferred, name, attributes)


@contextlib.contextmanager
def _timed(deferred: _Deferred, name: str, attributes: dict[str, Any]) -> Iterator[None]:
    started = time.time_ns()
    try:
        yield
    finally:
        deferred.steps.append((name, attributes, started, time.time_ns()))


class CallTracer:
    """The tool-call spans of one broker.

    A call answered at once on the channel thread (an echo or mock tool) is only timed there
    (two clock reads): its span is made with those times after the execution's result (with
    the steps' spans), so that tracing adds nothing to the round trip the script waits for,
    nor to the execution's time to its result. A call that
    waits for a handler gets its span when it is dispatched: that span is current while the
    handler runs, so a host handler's spans, or a client tool's across the gRPC stream, are its
    children. Either way a call's span starts when the call arrived and ends with its outcome.
    """

    def __init__(self, tracer: Tracer, parent: Context, deferred: _Deferred | None = None) -> None:
        self._tracer = tracer
        self._parent = parent
        self._deferred = deferred  # the execution's: where the calls answered at once go
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
        return cls(tracer, parent, _DEFERRED.get())

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
        made = [functools.partial(self._made, *item) for item in done]
        if self._deferred is not None:  # made after the execution's result, with its steps
            self._deferred.calls.extend(made)
        else:
            for make in made:
                make()
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

    def _made(self, record: CallRecord, arrived: int, ended: int, value: Any) -> None:
        self._close(self._opened(record, arrived), record, value, ended)

    def _opened(self, record: CallRecord, arrived: int) -> Span:
        return self._open(
            record.tool, record.seq, record.idempotency_key, record.arguments, arrived
        )
