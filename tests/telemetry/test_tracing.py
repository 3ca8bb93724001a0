"""Spans of executions and tool calls, read back from the OpenTelemetry SDK's in-memory exporter.

The server runs in this process (see conftest), so the client's spans, the server's, and those a
client tool makes while the server waits for it all land in one exporter: the test checks the
whole tree, across the gRPC stream in both directions.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sandbox.client import function_tool
from sandbox.engine import ExecutionRequest
from sandbox.telemetry import tracing
from sandbox.telemetry.spans import SPANS_PER_TURN
from sandbox.telemetry.tracing import DEFAULT_SPAN_QUEUE
from tests.telemetry.telemetry_support import PYTHON, ROOT, InProcessServer, echo_manifest


@pytest.fixture(scope="module")
def otel() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    yield exporter, provider
    tracing.reset()


@pytest.fixture
def exporter(
    otel: tuple[InMemorySpanExporter, TracerProvider], server: object
) -> InMemorySpanExporter:
    otel[0].clear()
    return otel[0]


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named: dict[str, ReadableSpan] = {}
    for span in spans:
        assert span.name not in named, f"two spans named {span.name}"
        named[span.name] = span
    return named


def _seq_of(attributes: Mapping[str, Any]) -> int:
    """A tool call span's ``ptc.tool.seq``: an int, or the test fails saying what it was."""
    seq = attributes["ptc.tool.seq"]
    assert isinstance(seq, int), attributes
    return seq


def _seq(span: ReadableSpan) -> int:
    return _seq_of(dict(span.attributes or {}))


def _finished(exporter: InMemorySpanExporter, count: int) -> tuple[ReadableSpan, ...]:
    """The exported spans once there are ``count``: the server makes an execution's last spans
    in a callback just after its result is returned."""
    deadline = time.monotonic() + 10
    while len(spans := exporter.get_finished_spans()) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return spans


def _parent(span: ReadableSpan) -> int:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.span_id


def test_span_tree_across_the_stream_with_a_client_tool(
    server: InProcessServer, otel, exporter: InMemorySpanExporter
) -> None:
    test_tracer = otel[1].get_tracer("test")

    def lookup(x: int) -> int:
        """Looks x up."""
        with test_tracer.start_as_current_span("client-lookup"):
            return x + 1

    tools = [function_tool(lookup, read_only=True), *json.loads(echo_manifest("echo1"))]
    script = "import tools\nprint(tools.lookup(x=1))\nprint(tools.echo1(x=2))\n"
    with test_tracer.start_as_current_span("agent-turn"):
        result = server.client.run(script, tools)
    assert (result.status, result.stdout) == ("ok", "2\n{'x': 2}\n")

    spans = _by_name(_finished(exporter, 7))
    assert set(spans) == {
        "agent-turn",
        "ptc.execution",
        "ptc.stubs.generate",
        "ptc.sandbox.acquire",
        "execute_tool lookup",
        "execute_tool echo1",
        "client-lookup",
    }
    root = spans["agent-turn"]
    assert {s.context.trace_id for s in spans.values()} == {root.context.trace_id}
    execution = spans["ptc.execution"]
    assert _parent(execution) == root.context.span_id
    for child in ("ptc.stubs.generate", "ptc.sandbox.acquire", "execute_tool lookup"):
        assert _parent(spans[child]) == execution.context.span_id
    assert _parent(spans["execute_tool echo1"]) == execution.context.span_id
    # The client tool's own span is a child of the server's span of that call.
    assert _parent(spans["client-lookup"]) == spans["execute_tool lookup"].context.span_id

    attrs = dict(execution.attributes or {})
    assert attrs["ptc.execution_id"] == result.execution_id
    assert (attrs["ptc.tenant"], attrs["ptc.backend"], attrs["ptc.status"]) == (
        "default",
        "process",
        "ok",
    )
    assert attrs["ptc.violations"] == ()
    assert attrs["ptc.usage.tool_calls"] == 2
    assert attrs["ptc.exit_code"] == 0
    assert attrs["ptc.usage.stdout_bytes"] == len(result.stdout)
    assert execution.status.status_code == StatusCode.UNSET

    for call in result.calls:
        span = spans[f"execute_tool {call.tool}"]
        tool_attrs = dict(span.attributes or {})
        assert tool_attrs["ptc.tool.name"] == call.tool
        assert tool_attrs["ptc.tool.seq"] == call.seq
        assert tool_attrs["ptc.tool.status"] == "ok"
        assert tool_attrs["ptc.tool.idempotency_key"] == f"{result.execution_id}:{call.seq}"
        assert tool_attrs["ptc.tool.duration_s"] == pytest.approx(call.duration_s, abs=1e-3)
        assert tool_attrs["gen_ai.tool.name"] == call.tool
        # Arguments and results only when the operator opts in.
        assert "ptc.tool.arguments" not in tool_attrs
        assert "ptc.tool.result" not in tool_attrs


def test_unary_execute_with_a_violation(
    server: InProcessServer, otel, exporter: InMemorySpanExporter
) -> None:
    script = (
        "import tools\nprint(tools.echo1(x=1))\n"
        "try:\n    tools.echo1(x=2)\nexcept tools.ToolError as e:\n    print(type(e).__name__)\n"
    )
    with otel[1].get_tracer("test").start_as_current_span("caller") as caller:
        result = server.client.execute(script, echo_manifest("echo1"), limits={"max_tool_calls": 1})
    assert result.status == "limit_exceeded"
    assert [v.limit for v in result.violations] == ["max_tool_calls"]

    spans = _finished(exporter, 6)  # caller, execution, stubs, acquire, two calls
    execution = next(s for s in spans if s.name == "ptc.execution")
    assert _parent(execution) == caller.get_span_context().span_id
    assert dict(execution.attributes or {})["ptc.violations"] == ("max_tool_calls",)
    assert execution.status.status_code == StatusCode.ERROR
    tool_spans = sorted(
        (s for s in spans if s.name == "execute_tool echo1"),
        key=_seq,
    )
    assert [dict(s.attributes or {})["ptc.tool.status"] for s in tool_spans] == ["ok", "refused"]
    assert [s.status.status_code for s in tool_spans] == [StatusCode.UNSET, StatusCode.ERROR]


def test_embedded_engine_with_payloads_opted_in_and_capped(
    server: InProcessServer, otel, exporter: InMemorySpanExporter, monkeypatch
) -> None:
    monkeypatch.setenv("PTC_OTEL_CAPTURE_PAYLOADS", "true")
    monkeypatch.setenv("PTC_OTEL_PAYLOAD_MAX_BYTES", "20")
    tracing.reset()
    tracing.enable(otel[1])
    manifest = [
        {
            "name": "say",
            "description": "Says s.",
            "parameters": {"type": "object", "properties": {"s": {"type": "string"}}},
            "x-ptc": {"mode": "echo", "read_only": True},
        }
    ]
    try:
        engine = server.server.engine
        result = server.call(
            engine.execute(
                ExecutionRequest(
                    script="import tools\ntools.say(s='a' * 100)\ntools.say(s='é')\n",
                    manifest=manifest,
                )
            )
        )
    finally:
        monkeypatch.delenv("PTC_OTEL_CAPTURE_PAYLOADS")
        tracing.reset()
        tracing.enable(otel[1])
    assert result.status == "ok"
    spans = _finished(exporter, 5)  # execution, stubs, acquire, two calls
    execution = next(s for s in spans if s.name == "ptc.execution")
    assert execution.parent is None  # the embedded API: its own trace
    assert dict(execution.attributes or {})["ptc.tenant"] == "default"
    calls = sorted(
        (dict(s.attributes or {}) for s in spans if s.name == "execute_tool say"),
        key=_seq_of,
    )
    long_args = json.dumps({"s": "a" * 100})
    assert calls[0]["ptc.tool.arguments"] == (
        long_args[:20] + f"[ptc: {len(long_args) - 20} bytes dropped]"
    )
    assert calls[0]["ptc.tool.result"] == calls[0]["ptc.tool.arguments"]
    assert calls[1]["ptc.tool.arguments"] == '{"s": "é"}'
    assert calls[1]["ptc.tool.result"] == '{"s": "é"}'


def test_tracing_off_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import asyncio, sys\n"
        "from sandbox.engine import Engine, ExecutionRequest\n"
        "from sandbox.server import SandboxServer\n"
        "from sandbox.client import Client\n"
        "async def main():\n"
        "    async with Engine() as engine:\n"
        "        r = await engine.execute(ExecutionRequest(script='import tools\\n"
        "print(tools.t(x=1))', manifest=sys.argv[1]))\n"
        "    print(r.status, r.stdout.strip())\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [PYTHON, "-c", code, echo_manifest("t")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok {'x': 1}\n[]\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin' (have: otlp, console, none)",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "x",
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL: unknown protocol 'x' (have: grpc, http/protobuf)",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_MAX_QUEUE_SIZE": "100"},
            "OTEL_BSP_* variables: max_export_batch_size must be less than or equal to "
            "max_queue_size.",
        ),
    ],
    ids=["unknown-exporter", "unknown-protocol", "queue-smaller-than-batch"],
)
def test_bad_otel_configuration_is_a_clear_error(env: dict[str, str], message: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--json"],
        cwd=ROOT,
        env={**base, **env},
        input="print(1)",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (2, "")
    assert message in proc.stderr


def test_cached_stubs_make_no_generation_span(
    server: InProcessServer, exporter: InMemorySpanExporter
) -> None:
    manifest = echo_manifest("cached_tool")
    for _ in range(2):
        exporter.clear()
        assert server.client.execute("print(1)", manifest).status == "ok"
        names = sorted(s.name for s in _finished(exporter, 2))
    # The second run found the module in the engine's cache: nothing was generated.
    assert names == ["ptc.execution", "ptc.sandbox.acquire"]


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-" + "0" * 32 + "-" + "0" * 16 + "-01",
        "00-" + "a" * 32 + "-xyz-01",
        "x" * 4000,
    ],
    ids=["garbage", "all-zero-ids", "bad-span-id", "huge"],
)
def test_a_malformed_traceparent_starts_a_new_trace(
    server: InProcessServer, exporter: InMemorySpanExporter, traceparent: str
) -> None:
    import grpc

    from sandbox._proto import sandbox_pb2_grpc as pb_grpc
    from sandbox.codec.request import Request, request_to_proto

    with grpc.insecure_channel(server.address) as channel:
        reply = pb_grpc.SandboxServiceStub(channel).Execute(
            request_to_proto(Request("print(1)", "[]")), metadata=(("traceparent", traceparent),)
        )
    assert reply.stdout == "1\n"
    execution = next(s for s in _finished(exporter, 2) if s.name == "ptc.execution")
    assert execution.parent is None  # not a child of anything the caller made up
    assert execution.context.trace_id != 0
    # And the server still serves.
    assert server.client.execute("print(2)").stdout == "2\n"


def test_spans_of_many_calls_are_all_made_and_end_inside_the_execution(
    server: InProcessServer, exporter: InMemorySpanExporter
) -> None:
    # More calls answered at once than the server makes spans per turn of its event loop: the
    # spans come over several turns, every one of them, and the execution's span ends last.
    calls = 5 * SPANS_PER_TURN + 3
    script = f"import tools\nfor i in range({calls}):\n    tools.many(x=i)\nprint('done')"
    result = server.client.execute(script, echo_manifest("many"))
    assert (result.status, result.stdout, len(result.calls)) == ("ok", "done\n", calls)

    spans = _finished(exporter, calls + 3)  # execution, stubs, acquire, the calls
    execution = next(s for s in spans if s.name == "ptc.execution")
    tool_spans = [s for s in spans if s.name == "execute_tool many"]
    assert sorted(_seq(s) for s in tool_spans) == list(range(1, calls + 1))
    assert {_parent(s) for s in tool_spans} == {execution.context.span_id}
    assert dict(execution.attributes or {})["ptc.usage.tool_calls"] == calls
    assert execution.end_time is not None
    assert max(s.end_time or 0 for s in tool_spans) <= execution.end_time
    # The execution's span is exported only once its last child is made.
    assert spans.index(execution) > max(spans.index(s) for s in tool_spans)


@pytest.mark.parametrize(
    ("env", "queue"), [({}, DEFAULT_SPAN_QUEUE), ({"OTEL_BSP_MAX_QUEUE_SIZE": "1000"}, 1000)]
)
def test_span_queue_holds_the_spans_of_concurrent_executions(
    env: dict[str, str], queue: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK reads OTEL_BSP_* from the process environment itself.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    provider = tracing._build_provider({"OTEL_TRACES_EXPORTER": "console", **env})
    try:
        processors = provider._active_span_processor._span_processors
        assert [p._batch_processor._max_queue_size for p in processors] == [queue]
    finally:
        provider.shutdown()
