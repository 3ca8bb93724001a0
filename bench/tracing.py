"""What OpenTelemetry tracing costs: on against off, interleaved in the same run.

Run: ``python -m bench.tracing [--rounds N]`` (the process backend, like bench.sandbox). "On" is
an SDK tracer provider with a batch span processor whose exporter encodes every batch to OTLP
protobuf and drops it (the work a real exporter does, without a collector's noise); "off" is no
configuration at all, the default. Both run on one engine, switched per case, in the same blocks.

1. ``print(1)`` end to end through the embedded `Engine`, warm pool: p50 on / off.
   Target: at most 1.05. Also shown: the CPU of an execution's tracing work, timed on its own,
   as a share of that p50, since the spans are made just after the result, off its path.
2. One echo tool call, as the script times it (2,000 sequential calls per execution, median
   per-call time of each execution): on / off. Target: at most 1.05. Also shown: the whole
   execution's time (the spans of calls answered at once are made after its result), and the
   CPU one tool-call span costs (made, and encoded for OTLP), against the round trip.
3. Off against no hooks at all: `Engine.run` without its tracing wrapper (the broker's and the
   steps' one-``None``-check hooks stay; they are timed on their own, per execution, and shown
   as a share of the print(1) p50). Target: nothing measurable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bench.harness import Report, bench_parser, interleave, percentile
from sandbox.backends.process.backend import ProcessBackend, ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest
from sandbox.limits import Limits
from sandbox.result import CallRecord, CallStatus
from sandbox.telemetry import tracing
from sandbox.telemetry.spans import CallTracer, step_span, traced_run
from sandbox.telemetry.tracing import DEFAULT_SPAN_QUEUE

ECHO = [
    {
        "name": "echo",
        "description": "Returns its arguments.",
        "parameters": {"type": "object", "properties": {"i": {"type": "integer"}}},
        "x-ptc": {"read_only": True},
    }
]
CALLS = 2000
CALLS_SCRIPT = """
import time, tools
times = []
for i in range({n}):
    t = time.perf_counter()
    tools.echo(i=i)
    times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2])
"""


class EncodingExporter(SpanExporter):
    """Encodes each batch as OTLP protobuf, as the OTLP exporter does, then drops it; counts
    the spans, the bytes and the CPU time that took (on the exporter's own thread)."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0
        self.cpu_s = 0.0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        started = time.thread_time()
        self.bytes += len(encode_spans(spans).SerializeToString())
        self.cpu_s += time.thread_time() - started
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class Counter(SpanProcessor):
    """Counts the spans ended, to compare with the spans exported (the batch processor drops
    what does not fit its queue)."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


def on(provider: TracerProvider) -> None:
    tracing.enable(provider)


def off() -> None:
    tracing.reset()  # no OTEL_* variables: the next use decides "off"
    assert tracing.tracer() is None


async def latency(
    report: Report, engine: Engine, backend: ProcessBackend, rounds: int, provider: TracerProvider
) -> float:
    async def quiet() -> None:
        await backend.pool.wait_ready()
        await backend.drain()
        await asyncio.sleep(0.02)

    request = ExecutionRequest("print(1)")

    async def run(enable: bool) -> None:
        on(provider) if enable else off()
        result = await engine.execute(request)
        assert result.stdout == "1\n", result.to_json()

    times = await interleave(
        {"tracing off": lambda: run(False), "tracing on": lambda: run(True)},
        rounds,
        before=quiet,
    )
    report.section("1. print(1), end to end, warm pool")
    for label, values in times.items():
        report.timings(label, values)
    off_p50 = percentile(times["tracing off"], 0.5)
    report.figure(
        "ratio p50 on / off", percentile(times["tracing on"], 0.5) / off_p50, "x", "target <= 1.05"
    )
    # The spans are made after the result is returned, so latency does not show all of their
    # CPU: the tracing work of one execution is timed on its own here (the same calls Engine.run
    # makes, around a run that does nothing, with the callback that makes the spans).
    result = await engine.execute(request)
    prepared = engine.prepare(request)

    async def nothing(_engine: Any, _prepared: Any, **_kwargs: Any) -> Any:
        with step_span("ptc.sandbox.acquire"):
            pass
        tracer = CallTracer.create()
        assert tracer is not None
        tracer.finish([])
        return result

    traced = traced_run(nothing)
    on(provider)
    n = 2000
    used = time.process_time()
    for _ in range(n):
        await traced(engine, prepared)
        await asyncio.sleep(0)  # the loop runs the callback that makes the spans
    work = (time.process_time() - used) / n
    off()
    report.figure("tracing work per execution, on (CPU)", work * 1e6, "us")
    report.figure("  as a share of print(1) p50", work / off_p50 * 100, "%", "target <= 5")
    return off_p50


async def tool_calls(
    report: Report,
    engine: Engine,
    rounds: int,
    provider: TracerProvider,
    exporter: EncodingExporter,
) -> None:
    limits = replace(engine.effective_limits(Limits())[0], max_tool_calls=CALLS)
    request = ExecutionRequest(CALLS_SCRIPT.format(n=CALLS), ECHO)

    whole: dict[bool, list[float]] = {False: [], True: []}

    async def run(enable: bool) -> float:
        on(provider) if enable else off()
        started = time.perf_counter()
        result = await engine.execute(request, limits=(limits, []))
        whole[enable].append(time.perf_counter() - started)
        assert result.status == "ok", result.to_json()
        return float(result.stdout)

    times = await interleave(
        {"tracing off": lambda: run(False), "tracing on": lambda: run(True)},
        rounds,
    )
    report.section(f"2. one echo tool call, as the script times it ({CALLS} calls per run)")
    for label, values in times.items():
        report.timings(label, values, unit="us")
    report.figure(
        "ratio p50 on / off",
        percentile(times["tracing on"], 0.5) / percentile(times["tracing off"], 0.5),
        "x",
        "target <= 1.05",
    )
    # Not a target, shown for what it is: the spans of calls answered at once are made after
    # the execution's result, off the round trip; their CPU shows in the next block's time.
    for enable, label in ((False, "whole execution, off"), (True, "whole execution, on")):
        report.timings(label, whole[enable][1:])  # the first of each is the warm-up
    report.figure(
        "whole execution: extra per call, on",
        (percentile(whole[True][1:], 0.5) - percentile(whole[False][1:], 0.5)) / CALLS * 1e6,
        "us",
    )
    # The CPU a tool-call span costs the server, wherever it is spent: made on the event loop
    # after the result (timed here on its own, as CallTracer makes them), encoded for OTLP on
    # the exporter's thread (timed by the exporter over the whole run).
    tracer = provider.get_tracer("bench")
    parent = trace.set_span_in_context(tracer.start_span("parent"))
    calls = CallTracer(tracer, parent)
    records = [
        CallRecord(
            seq=i, tool="echo", arguments={"i": i}, status=CallStatus.OK, idempotency_key=f"x:{i}"
        )
        for i in range(CALLS)
    ]
    used = time.process_time()
    for record in records:
        calls.start(record)
        calls.end(record, record.arguments)
    calls.finish(records)
    make = (time.process_time() - used) / CALLS
    provider.force_flush()
    encode = exporter.cpu_s / max(exporter.spans, 1)
    round_trip = percentile(times["tracing off"], 0.5)
    report.figure("CPU per tool-call span: made", make * 1e6, "us")
    report.figure("CPU per tool-call span: OTLP encoding", encode * 1e6, "us")
    report.figure(
        "  together, as a share of the round trip", (make + encode) / round_trip * 100, "%"
    )


async def hooks_off(
    report: Report, engine: Engine, backend: ProcessBackend, rounds: int, print_p50: float
) -> None:
    off()
    unwrapped = Engine.run.__wrapped__  # type: ignore[attr-defined]

    async def quiet() -> None:
        await backend.pool.wait_ready()
        await backend.drain()
        await asyncio.sleep(0.02)

    async def run(hooked: bool) -> None:
        prepared = engine.prepare(ExecutionRequest("print(1)"))
        result = await (engine.run(prepared) if hooked else unwrapped(engine, prepared))
        assert result.stdout == "1\n"

    times = await interleave(
        {"no tracing wrapper": lambda: run(False), "tracing off": lambda: run(True)},
        rounds,
        before=quiet,
    )
    report.section("3. tracing off against no hooks")
    for label, values in times.items():
        report.timings(label, values)
    report.figure(
        "ratio p50 off / no wrapper",
        percentile(times["tracing off"], 0.5) / percentile(times["no tracing wrapper"], 0.5),
        "x",
        "target: within noise",
    )
    # Every hook an execution with one tool call passes while off, timed on its own.
    n = 100_000
    started = time.perf_counter()
    for _ in range(n):
        tracing.tracer()  # Engine.run's wrapper
        with step_span("ptc.stubs.generate"):
            pass
        with step_span("ptc.sandbox.acquire"):
            pass
        CallTracer.create()  # the broker's
    per_execution = (time.perf_counter() - started) / n
    report.figure("hooks per execution, off", per_execution * 1e6, "us")
    report.figure("  as a share of print(1) p50", per_execution / print_p50 * 100, "%", fmt=".4f")


async def main(report: Report, rounds: int, call_rounds: int) -> None:
    exporter = EncodingExporter()
    counter = Counter()
    provider = TracerProvider()
    # The queue the server's own configuration uses (OTEL_BSP_MAX_QUEUE_SIZE unset).
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=DEFAULT_SPAN_QUEUE))
    provider.add_span_processor(counter)
    backend = ProcessBackend(ProcessBackendConfig(pool_size=2))
    engine = Engine(EngineConfig(backends={"process": backend}))
    await engine.start()
    try:
        await backend.pool.wait_ready()
        print_p50 = await latency(report, engine, backend, rounds, provider)
        await tool_calls(report, engine, call_rounds, provider, exporter)
        await hooks_off(report, engine, backend, rounds, print_p50)
    finally:
        off()
        await engine.close()
        provider.shutdown()
    report.print(
        f"spans made {counter.ended}, exported {exporter.spans} "
        f"(dropped {counter.ended - exporter.spans}), {exporter.bytes} bytes of OTLP "
        f"({exporter.bytes / max(exporter.spans, 1):.0f} bytes a span)"
    )


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=40)
    parser.add_argument("--call-rounds", type=int, default=21, help="blocks of the call figure")
    args = parser.parse_args()
    with Report("tracing", args) as report:
        asyncio.run(main(report, args.rounds, args.call_rounds))
