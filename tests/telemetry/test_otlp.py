"""Spans exported over OTLP/gRPC, configured only by the standard OTEL_* variables, to a
collector this test serves on loopback (the OTLP TraceService from opentelemetry-proto).

`ptc run` exports the spans of its embedded execution; `ptc run --server` and `ptc serve` (two
processes) export one trace together: the server's execution span is a child of the CLI's
`ptc.run` span, whose context travelled in the gRPC metadata.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.ptc_cli import run_ptc
from tests.ptc_serve import ptc_serve
from tests.telemetry.telemetry_support import echo_manifest


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "service": resource.get("service.name"),
                                "attributes": {a.key: a.value for a in span.attributes},
                            }
                        )
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[_Collector, str]]:
    servicer = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # opentelemetry-proto's generated gRPC module carries no annotations.
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"http://127.0.0.1:{port}"
    server.stop(0)


def _otel(endpoint: str, service: str) -> dict[str, str]:
    """The OpenTelemetry settings of a `ptc` process: its only OTEL_ variables (see `_not_ours`)."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _not_ours() -> list[str]:
    """The OTEL_ variables of this process's environment, kept from a `ptc` subprocess."""
    return [k for k in os.environ if k.startswith("OTEL_")]


def _env(endpoint: str, service: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _not_ours()}
    return {**base, **_otel(endpoint, service)}


def test_ptc_run_exports_its_spans_over_otlp(collector, tmp_path) -> None:
    servicer, endpoint = collector
    (tmp_path / "tools.json").write_text(echo_manifest("lookup"))
    proc = run_ptc(
        "run", "-", "--tools", str(tmp_path / "tools.json"), "--json",
        stdin="import tools\nfor i in range(3):\n    tools.lookup(x=i)\nprint('done')\n",
        env=_otel(endpoint, "ptc-otlp-test"),
        without=_not_ours(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "ok"

    spans = servicer.spans
    names = sorted(s["name"] for s in spans)
    assert names == [
        "execute_tool lookup",
        "execute_tool lookup",
        "execute_tool lookup",
        "ptc.execution",
        "ptc.sandbox.acquire",
        "ptc.stubs.generate",
    ]
    assert {s["service"] for s in spans} == {"ptc-otlp-test"}
    execution = next(s for s in spans if s["name"] == "ptc.execution")
    assert execution["parent"] == ""
    assert execution["attributes"]["ptc.execution_id"].string_value == result["execution_id"]
    assert execution["attributes"]["ptc.status"].string_value == "ok"
    assert execution["attributes"]["ptc.usage.tool_calls"].int_value == 3
    others = [s for s in spans if s is not execution]
    assert {s["trace_id"] for s in others} == {execution["trace_id"]}
    assert {s["parent"] for s in others} == {execution["span_id"]}
    seqs = sorted(
        s["attributes"]["ptc.tool.seq"].int_value
        for s in spans
        if s["name"] == "execute_tool lookup"
    )
    assert seqs == [1, 2, 3]


def test_serve_and_client_export_one_trace(collector, tmp_path) -> None:
    servicer, endpoint = collector
    (tmp_path / "tools.json").write_text(echo_manifest("lookup"))
    with ptc_serve(
        "--pool-size", "1", "--audit-db", "memory", env=_env(endpoint, "ptc-serve-test")
    ) as serving:
        proc = run_ptc(
            "run", "-", "--tools", str(tmp_path / "tools.json"), "--json",
            "--server", serving.address,
            stdin="import tools\nprint(tools.lookup(x=7))\n",
            env=_otel(endpoint, "ptc-cli-test"),
            without=_not_ours(),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["stdout"] == "{'x': 7}\n"

    spans = {s["name"]: s for s in servicer.spans}
    assert set(spans) == {
        "ptc.run",
        "ptc.execution",
        "ptc.stubs.generate",
        "ptc.sandbox.acquire",
        "execute_tool lookup",
    }
    root = spans["ptc.run"]
    assert (root["service"], root["parent"]) == ("ptc-cli-test", "")
    assert spans["ptc.execution"]["service"] == "ptc-serve-test"
    assert spans["ptc.execution"]["parent"] == root["span_id"]
    assert {s["trace_id"] for s in spans.values()} == {root["trace_id"]}
    assert spans["execute_tool lookup"]["parent"] == spans["ptc.execution"]["span_id"]
