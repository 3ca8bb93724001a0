"""OpenTelemetry traces of executions and their tool calls; off, and free, unless configured.

Tracing is on when the process has a tracer provider to write to, decided once, on first use:

1. ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``: off.
2. `enable(provider)` was called (tests, an embedding application): that provider.
3. The application already installed an SDK tracer provider globally: that one.
4. ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
   ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set: an SDK provider of our own, with a batch
   processor and the exporter those variables name, configured by the SDK from the standard
   ``OTEL_*`` variables (service name, resource attributes, headers, batch sizes). OTLP goes
   over gRPC (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``, the default); ``http/protobuf`` needs
   ``opentelemetry-exporter-otlp-proto-http``.
5. Otherwise: off. Nothing of OpenTelemetry is imported and every hook is one ``None`` check.

Spans (names low-cardinality, details in attributes):

    ptc.execution                 one per execution: tenant, backend, runtime, status, exit code,
    ├─ ptc.stubs.generate         violations and usage (stubs: only when generated, not when
    ├─ ptc.sandbox.acquire        the manifest's module was cached)
    └─ execute_tool {tool}        one per tool call: tool, seq, status, duration, idempotency key
       └─ (the tool's own spans: a host handler's, or a client tool's across the gRPC stream)

Arguments and results go on tool spans only when the operator opts in with
``PTC_OTEL_CAPTURE_PAYLOADS=true``, each cut at ``PTC_OTEL_PAYLOAD_MAX_BYTES`` (default 1024)
with a marker naming the bytes dropped.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "PayloadPolicy",
    "enable",
    "extract_context",
    "inject_context",
    "inject_current",
    "reset",
    "shutdown",
    "tracer",
]

TRACER_NAME = "ptc.sandbox"
DEFAULT_PAYLOAD_MAX_BYTES = 1024
# The batch processor's queue when OTEL_BSP_MAX_QUEUE_SIZE is unset. The SDK's own default (2048
# spans) drops spans (one log line) as soon as two executions that each make the default
# maximum of 1000 tool calls end together: their call spans arrive at once, after the results.
# 16384 spans hold sixteen of them, a few tens of MiB at most while the exporter catches up.
DEFAULT_SPAN_QUEUE = 16384

_lock = threading.Lock()


class _State:
    resolved = False
    tracer: Tracer | None = None
    own_provider: Any = None  # the SDK provider this module built (flushed by `shutdown`)
    payloads: PayloadPolicy | None = None


_state = _State()


class PayloadPolicy:
    """Whether tool arguments and results go on spans, and at most how many bytes of each."""

    def __init__(self, capture: bool, max_bytes: int) -> None:
        self.capture = capture
        self.max_bytes = max_bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PayloadPolicy:
        capture = environ.get("PTC_OTEL_CAPTURE_PAYLOADS", "").strip().lower() == "true"
        raw = environ.get("PTC_OTEL_PAYLOAD_MAX_BYTES", "").strip()
        try:
            max_bytes = int(raw) if raw else DEFAULT_PAYLOAD_MAX_BYTES
        except ValueError:
            from sandbox.errors import InvalidArgument

            raise InvalidArgument(
                f"PTC_OTEL_PAYLOAD_MAX_BYTES: {raw!r} is not a whole number of bytes"
            ) from None
        return cls(capture, max(0, max_bytes))

    def render(self, value: Any) -> str:
        """``value`` as JSON, cut at the cap with a marker naming what was dropped."""
        text = json.dumps(value, ensure_ascii=False, default=str)
        data = text.encode("utf-8", "surrogatepass")
        if len(data) <= self.max_bytes:
            return text
        kept = data[: self.max_bytes].decode("utf-8", "ignore")
        dropped = len(data) - len(kept.encode("utf-8", "surrogatepass"))
        return f"{kept}[ptc: {dropped} bytes dropped]"


def _env_off(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return True
    return environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"


def _env_on(environ: Mapping[str, str]) -> bool:
    return any(
        environ.get(name, "").strip()
        for name in (
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )


def tracer() -> Tracer | None:
    """The tracer of this process, or None when tracing is off (the common, free case)."""
    if _state.resolved:
        return _state.tracer
    return _resolve()


def payloads() -> PayloadPolicy:
    if _state.payloads is None:
        _state.payloads = PayloadPolicy.from_env()
    return _state.payloads


def _resolve() -> Tracer | None:
    with _lock:
        if _state.resolved:
            return _state.tracer
        environ = os.environ
        if _env_off(environ):
            _state.tracer = None
        elif _global_sdk_provider() is not None:
            from opentelemetry import trace

            _state.tracer = trace.get_tracer(TRACER_NAME)
        elif _env_on(environ):
            provider = _build_provider(environ)
            from opentelemetry import trace

            trace.set_tracer_provider(provider)
            _state.own_provider = provider
            _state.tracer = provider.get_tracer(TRACER_NAME)
        else:
            _state.tracer = None
        _state.resolved = True
        return _state.tracer


def _global_sdk_provider() -> Any:
    """The application's own SDK provider, if it installed one (only looked for when the
    application has imported OpenTelemetry already: we never import it to find out)."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None
    return provider


def _build_provider(environ: Mapping[str, str]) -> Any:
    from sandbox.errors import InvalidArgument

    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise InvalidArgument(
            "OTEL_* variables ask for traces, and the OpenTelemetry SDK is not installed: "
            "pip install 'ptc-sandbox[otel]' (or unset them)"
        ) from exc

    names = [
        n.strip().lower()
        for n in (environ.get("OTEL_TRACES_EXPORTER", "") or "otlp").split(",")
        if n.strip()
    ]
    resource = Resource.create(
        {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": "ptc-sandbox"}
    )
    provider = TracerProvider(resource=resource)
    # OTEL_BSP_MAX_QUEUE_SIZE decides where it is set; see DEFAULT_SPAN_QUEUE.
    queue = None if environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else DEFAULT_SPAN_QUEUE
    for name in names:
        exporter: Any
        if name == "otlp":
            exporter = _otlp_exporter(environ)
        elif name == "console":
            exporter = ConsoleSpanExporter(out=sys.stderr)
        else:
            raise InvalidArgument(
                f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (have: otlp, console, none)"
            )
        try:
            processor = BatchSpanProcessor(exporter, max_queue_size=queue)
        except ValueError as exc:  # e.g. a queue smaller than the export batch
            raise InvalidArgument(f"OTEL_BSP_* variables: {exc}") from exc
        provider.add_span_processor(processor)
    return provider


def _otlp_exporter(environ: Mapping[str, str]) -> Any:
    from sandbox.errors import InvalidArgument

    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as HttpExporter,
            )

            return HttpExporter()
    except ImportError as exc:
        raise InvalidArgument(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: its exporter is not installed "
            f"({exc.name}); install ptc-sandbox[otel]"
        ) from exc
    raise InvalidArgument(
        f"OTEL_EXPORTER_OTLP_PROTOCOL: unknown protocol {protocol!r} (have: grpc, http/protobuf)"
    )


def enable(provider: TracerProvider) -> None:
    """Traces to ``provider`` from now on (for tests and applications that embed the engine)."""
    with _lock:
        _state.tracer = provider.get_tracer(TRACER_NAME)
        _state.resolved = True


def reset() -> None:
    """Forgets the decision, so that the next use decides again (tests)."""
    with _lock:
        _state.resolved = False
        _state.tracer = None
        _state.payloads = None


def shutdown() -> None:
    """Flushes and closes the provider this module built, if any (at process exit)."""
    provider, _state.own_provider = _state.own_provider, None
    if provider is not None:
        provider.shutdown()


# -- context across processes -------------------------------------------------------------------
def extract_context(carrier: Mapping[str, str]) -> Context | None:
    """The remote parent a caller sent (W3C ``traceparent``), when tracing is on."""
    if tracer() is None or "traceparent" not in carrier:
        return None
    from opentelemetry import propagate

    return propagate.extract(carrier)


def inject_context(carrier: MutableMapping[str, str]) -> None:
    """Writes the current span's context into ``carrier``, when there is one to write.

    Used by clients, which follow the application's OpenTelemetry set-up whatever ours is:
    when the application has not imported OpenTelemetry there is no context to send."""
    if "opentelemetry.trace" not in sys.modules:
        return
    from opentelemetry import propagate

    propagate.inject(carrier)


def inject_current(carrier: MutableMapping[str, str]) -> None:
    """`inject_context` for the server's own spans: nothing unless tracing is on."""
    if tracer() is not None:
        from opentelemetry import propagate

        propagate.inject(carrier)


@contextmanager
def attached(ctx: Context | None) -> Iterator[None]:
    """Makes ``ctx`` the current context for the block (nothing when it is None)."""
    if ctx is None:
        yield
        return
    from opentelemetry import context

    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def client_tool_context(carrier: Mapping[str, str]) -> Iterator[None]:
    """On the client: the server's tool-call span (sent with the request) is current while the
    tool runs, so that the tool's own spans join the caller's trace. Follows the application's
    OpenTelemetry set-up: nothing happens when it has not imported OpenTelemetry."""
    if not carrier or "opentelemetry.trace" not in sys.modules:
        yield
        return
    from opentelemetry import propagate

    with attached(propagate.extract(dict(carrier))):
        yield


def current_context() -> Context | None:
    if tracer() is None:
        return None
    from opentelemetry import context

    return context.get_current()


def span_context(span: Span) -> Context:
    from opentelemetry import trace

    return trace.set_span_in_context(span)
