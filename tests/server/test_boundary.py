"""The gRPC boundary under hostile input, one test per reproducer of the hostile-request survey:
every client mistake is a documented status whose bounded message names the field, nothing is
logged with a traceback or at ERROR, and the server keeps serving. Against a real `ptc serve`
with a tenants file (two keys), raw bytes sent through identity serializers."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import Client
from sandbox.errors import MAX_STATUS_CHARS, InvalidArgument
from sandbox.limits import LIMIT_SPECS
from sandbox.request_caps import MAX_MANIFEST_BYTES, MAX_SCRIPT_BYTES
from sandbox.server.app import RECEIVE_LIMIT_BYTES
from sandbox.tenants.keys import hash_key
from tests.ptc_serve import PYTHON, ROOT, Serving, ptc_serve

SERVICE = "/ptc.sandbox.v1.SandboxService/"
BURSTS_SENT: list[int] = []  # malformed requests sent by the burst test, when it ran
ALPHA = (("authorization", "Bearer key-alpha"),)
CLIENT_TOOL = json.dumps(
    [{"name": "ask", "parameters": {"type": "object"}, "x-ptc": {"mode": "client"}}]
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(
        f'[[tenant]]\nid = "alpha"\nkeys = ["{hash_key("key-alpha")}"]\n'
        f'[[tenant]]\nid = "beta"\nkeys = ["{hash_key("key-beta")}"]\n'
    )
    started = time.monotonic()
    with ptc_serve("--pool-size", "2", "--tenants", str(tenants)) as serving:
        yield serving
    # Well over a hundred malformed requests were sent: their WARNING lines are rate-limited to
    # one per 10 s (each counting those it stood for), so a client cannot flood the log.
    lines = serving.stderr.count("malformed request from")
    assert lines <= 1 + (time.monotonic() - started) / 10, serving.stderr
    assert lines >= len(BURSTS_SENT[:1]), serving.stderr  # the burst below was reported
    # Nothing a client sent was logged as the server's own failure.
    assert "Traceback" not in serving.stderr, serving.stderr
    assert " ERROR " not in serving.stderr and "ERROR " not in serving.stderr, serving.stderr
    assert "Task exception was never retrieved" not in serving.stderr, serving.stderr


@pytest.fixture(scope="module")
def channel(served: Serving) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.address) as ch:  # default options, as any client
        yield ch


def _raw(
    channel: grpc.Channel, method: str, data: bytes, metadata: Sequence[tuple[str, str]] = ALPHA
) -> tuple[grpc.StatusCode, str, bytes]:
    # No serializers: the bytes go and come as they are.
    call = channel.unary_unary(SERVICE + method, None, None)
    try:
        return grpc.StatusCode.OK, "", call(data, metadata=tuple(metadata))
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", b""


def _assert_healthy(served: Serving, channel: grpc.Channel) -> None:
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert status.status == health_pb2.HealthCheckResponse.SERVING
    with Client(served.address, api_key="key-alpha") as client:
        result = client.execute("print('still ok')")
    assert (result.status, result.stdout) == ("ok", "still ok\n")


# -- 1: not protobuf, or a string that is not UTF-8 -------------------------------------------
@pytest.mark.parametrize(
    ("method", "data", "expected"),
    [
        ("GenerateStubs", b"}", "GenerateStubsRequest: field number 15: truncated at byte 1"),
        ("GetSession", b"\n\x03\xed\xa0\x80", "session_id: not valid UTF-8"),
        ("Execute", b"\x12\x04\x0a\x02\xc3\x28", "manifest.json: not valid UTF-8"),
        ("Execute", b"\x1a\x03\x18\xff\xff", "limits.memory_bytes: truncated varint"),
        ("ListExecutions", b"\x0a\x05\x08", "since: 5 bytes declared at byte 2, 1 present"),
        ("Replay", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "ReplayRequest: truncated"),
    ],
    ids=["stubs-brace", "session-surrogate", "manifest-utf8", "varint", "length", "tag"],
)
def test_undecodable_request_names_the_field(served, channel, method, data, expected):
    code, details, _ = _raw(channel, method, data)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(expected), details


def test_undecodable_stream_start_names_the_field(served, channel):
    stream = channel.stream_stream(SERVICE + "ExecuteStream")
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([b"\x0a\x03\x0a\x01\xff"]), metadata=ALPHA))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "start.script: not valid UTF-8 (byte 0 of 1)"


def test_a_burst_of_undecodable_requests_logs_one_warning(served, channel):
    for _ in range(50):
        assert _raw(channel, "GenerateStubs", b"}")[0] == grpc.StatusCode.INVALID_ARGUMENT
    BURSTS_SENT.append(50)
    _assert_healthy(served, channel)
    # The log is checked at the end of the module (no ERROR, no traceback); the warnings are
    # rate-limited to one line per 10 s, so 50 requests here are at most a couple of lines.


# -- 2: timestamps out of range ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("since", "expected"),
    [
        ({"nanos": -1}, "since.nanos: -1 is outside 0 to 999999999"),
        ({"seconds": 2**62}, f"since.seconds: {2**62} is outside"),
        ({"seconds": -(2**40)}, f"since.seconds: {-(2**40)} is outside"),
    ],
    ids=["nanos-negative", "seconds-huge", "seconds-before-year-1"],
)
def test_timestamp_out_of_range(served, channel, since, expected):
    data = pb.ListExecutionsRequest(since=since).SerializeToString()
    code, details, _ = _raw(channel, "ListExecutions", data)
    assert (code, details[: len(expected)]) == (grpc.StatusCode.INVALID_ARGUMENT, expected)
    until = pb.ListExecutionsRequest(until=since).SerializeToString()
    assert _raw(channel, "ListExecutions", until)[1].startswith("until.")


# -- 3: every limit has a minimum -------------------------------------------------------------
BELOW_MINIMUM = [spec for spec in LIMIT_SPECS if spec.minimum > 1]


@pytest.mark.parametrize("spec", BELOW_MINIMUM, ids=[s.name for s in BELOW_MINIMUM])
def test_limit_below_its_minimum_is_refused_naming_it(served, channel, spec):
    request = pb.ExecuteRequest(
        script="print(1)", limits=pb.Limits(**{spec.field: spec.minimum - 1})
    )
    code, details, _ = _raw(channel, "Execute", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == (
        f"limits.{spec.field}: {spec.describe(spec.minimum - 1)} is below the minimum of "
        f"{spec.describe(spec.minimum)}"
    )


@pytest.mark.parametrize("spec", LIMIT_SPECS, ids=[s.name for s in LIMIT_SPECS])
def test_limit_at_its_minimum_runs(served, channel, spec):
    request = pb.ExecuteRequest(script="print(1)", limits=pb.Limits(**{spec.field: spec.minimum}))
    code, details, data = _raw(channel, "Execute", request.SerializeToString())
    assert code == grpc.StatusCode.OK, details
    result = pb.ExecutionResult.FromString(data)
    # A result, whatever the limit did to the script (1 byte of stdout truncates "1\n").
    assert result.status in (pb.EXECUTION_STATUS_OK, pb.EXECUTION_STATUS_LIMIT_EXCEEDED)
    assert getattr(result.effective_limits, spec.field) == spec.minimum


def test_session_memory_below_minimum_is_refused(served, channel):
    request = pb.CreateSessionRequest(limits=pb.Limits(memory_bytes=1000))
    code, details, _ = _raw(channel, "CreateSession", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("limits.memory_bytes: 1000 bytes is below the minimum of"), details


# -- 4: messages quote inputs cut to a bounded length -----------------------------------------
@pytest.mark.parametrize(
    ("method", "request_", "code", "prefix"),
    [
        (
            "ListExecutions",
            pb.ListExecutionsRequest(page_token="t" * (1 << 20)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token: 'tttt",
        ),
        (
            "GetExecution",
            pb.GetExecutionRequest(execution_id="x" * 100_000),
            grpc.StatusCode.NOT_FOUND,
            "execution_id: no execution 'xxxx",
        ),
        (
            "GetSession",
            pb.GetSessionRequest(session_id="s" * 100_000),
            grpc.StatusCode.NOT_FOUND,
            "session_id: no session 'ssss",
        ),
        (
            "ListExecutions",
            pb.ListExecutionsRequest(violation="v" * 100_000),
            grpc.StatusCode.INVALID_ARGUMENT,
            "violation: unknown limit 'vvvv",
        ),
    ],
    ids=["page-token", "execution-id", "session-id", "violation"],
)
def test_error_messages_quote_inputs_cut(served, channel, method, request_, code, prefix):
    got, details, _ = _raw(channel, method, request_.SerializeToString())
    assert got == code  # the real error, not the client's metadata limit
    assert details.startswith(prefix), details[:200]
    assert "more characters)" in details and len(details) <= 200, details


def test_every_status_message_is_bounded(served, channel):
    # A manifest whose error names a tool: the name is 500 KB, the status is not.
    name = "n" * 500_000
    manifest = json.dumps([{"name": name, "parameters": {"type": 7}}])
    request = pb.GenerateStubsRequest(manifest=pb.ToolManifest(json=manifest))
    code, details, _ = _raw(channel, "GenerateStubs", request.SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("manifest: ") and len(details) <= MAX_STATUS_CHARS + 40, len(details)


# -- 5: one credential ------------------------------------------------------------------------
def test_two_authorization_headers_are_refused(served, channel):
    both = [("authorization", "Bearer key-alpha"), ("authorization", "Bearer key-beta")]
    data = pb.ListExecutionsRequest().SerializeToString()
    code, details, _ = _raw(channel, "ListExecutions", data, both)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert details == "authorization: sent 2 times; send exactly one 'Bearer <API key>'"
    stream = channel.stream_stream(SERVICE + "ExecuteStream")
    start = pb.ClientMessage(start=pb.ExecuteRequest(script="print(1)")).SerializeToString()
    with pytest.raises(grpc.RpcError) as info:
        list(stream(iter([start]), metadata=both))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


# -- 6: a malformed message mid-stream ends it at once ----------------------------------------
@pytest.mark.parametrize(
    ("second", "expected"),
    [
        (b"\x12\x03\x0a\x01", "tool_answer: 3 bytes declared at byte 2, 2 present"),
        (b"\x12\x04\x12\x02\xc3\x28", "tool_answer.result_json: not valid UTF-8"),
        (pb.ClientMessage().SerializeToString(), "message: empty client message"),
    ],
    ids=["truncated", "not-utf8", "empty"],
)
def test_malformed_stream_message_ends_the_stream_and_the_run(served, channel, second, expected):
    request = pb.ExecuteRequest(
        script="import tools\nprint(tools.ask())",
        manifest=pb.ToolManifest(json=CLIENT_TOOL),
        limits=pb.Limits(wall_time_ms=60_000),
    )
    outbox: queue.Queue[bytes | None] = queue.Queue()
    outbox.put(pb.ClientMessage(start=request).SerializeToString())

    def messages() -> Iterator[bytes]:
        while (item := outbox.get(timeout=60)) is not None:
            yield item

    call = channel.stream_stream(SERVICE + "ExecuteStream")(messages(), metadata=ALPHA)
    execution_id = ""
    with pytest.raises(grpc.RpcError) as info:
        for raw in call:
            event = pb.ServerEvent.FromString(raw)
            if event.HasField("started"):
                execution_id = event.started.execution_id
            if event.HasField("tool_call"):  # the script waits: answer with garbage
                outbox.put(second)
    outbox.put(None)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(expected), info.value.details()
    # The run was stopped and recorded as cancelled, not left to its 60 s wall time.
    get = pb.GetExecutionRequest(execution_id=execution_id).SerializeToString()
    record = b""
    for _ in range(100):
        code, _details, record = _raw(channel, "GetExecution", get)
        if code == grpc.StatusCode.OK and pb.ExecutionRecord.FromString(record).result.status:
            break
        threading.Event().wait(0.1)
    assert pb.ExecutionRecord.FromString(record).result.status == pb.EXECUTION_STATUS_CANCELLED


# -- 7: cancelled streams and 1 ms deadlines leave no task behind -----------------------------
def test_cancelled_and_expired_streams_leave_nothing_behind(served, channel):
    stub = channel.stream_stream(
        SERVICE + "ExecuteStream",
        request_serializer=pb.ClientMessage.SerializeToString,
        response_deserializer=pb.ServerEvent.FromString,
    )
    script = "import sys\nfor i in range(2000):\n    print(i, flush=True)\n"
    start = pb.ClientMessage(start=pb.ExecuteRequest(script=script))
    for _ in range(10):  # the task was left behind in about half the runs before
        with pytest.raises(grpc.RpcError) as info:
            list(stub(iter([start]), metadata=ALPHA, timeout=0.001))
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        call = stub(iter([start]), metadata=ALPHA)
        next(call)  # started: the run is on
        call.cancel()
    _assert_healthy(served, channel)
    # "Task exception was never retrieved" is checked in the server's log at the module's end.


# -- 8: the SDK checks sizes before sending, with the embedded message ------------------------
def test_sdk_refuses_oversized_requests_before_sending():
    # Nothing listens on port 9: a refusal that names the field was made before sending.
    with Client("127.0.0.1:9") as client:
        with pytest.raises(InvalidArgument, match=rf"^script: larger than {MAX_SCRIPT_BYTES}"):
            client.execute("#" * (MAX_SCRIPT_BYTES + 1))
        manifest = json.dumps([{"name": "t", "description": "d" * MAX_MANIFEST_BYTES}])
        with pytest.raises(
            InvalidArgument, match=rf"^manifest: larger than {MAX_MANIFEST_BYTES} bytes"
        ):
            client.stubs(manifest)
        with pytest.raises(InvalidArgument, match=r"^input_files: 1025 files is more than"):
            client.execute("print(1)", files={f"f{i}": b"" for i in range(1025)})
        with pytest.raises(InvalidArgument, match=r"^labels: more than 64 labels"):
            client.execute("print(1)", labels={f"k{i}": "v" for i in range(65)})
        with pytest.raises(InvalidArgument, match=r"^labels\['k'\]: longer than 1024"):
            client.session(labels={"k": "v" * 1025}).create()


def test_session_labels_are_checked_as_an_execution_s(served, channel):
    request = pb.CreateSessionRequest(labels={"k": "v" * 100_000})
    code, details, _ = _raw(channel, "CreateSession", request.SerializeToString())
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "labels['k']: longer than 1024 characters",
    )


@pytest.mark.parametrize("what", ["script", "manifest"])
@pytest.mark.parametrize("where", ["embedded", "server"])
def test_ptc_run_oversized_request_same_message(served, tmp_path: Path, where, what):
    script, manifest = tmp_path / "script.py", tmp_path / "tools.json"
    script.write_text("#" * (MAX_SCRIPT_BYTES + 1) if what == "script" else "print(1)")
    big = [{"name": "t", "description": "d" * MAX_MANIFEST_BYTES}]
    manifest.write_text(json.dumps(big if what == "manifest" else []))
    extra = ["--server", served.address, "--api-key", "key-alpha"] if where == "server" else []
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "sandbox.cli",
            "run",
            str(script),
            "--tools",
            str(manifest),
            "--json",
            *extra,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    cap = MAX_SCRIPT_BYTES if what == "script" else MAX_MANIFEST_BYTES
    assert proc.returncode == 2, proc.stderr
    assert f"{what}: larger than {cap} bytes" in proc.stderr, proc.stderr


# -- 9: oversized requests are refused before they are read -----------------------------------
def test_request_above_the_receive_limit_is_refused_by_grpc(served, channel):
    big = pb.ExecuteRequest(
        script="print(1)", input_files=[pb.InputFile(name="f", content=b"\0" * RECEIVE_LIMIT_BYTES)]
    ).SerializeToString()
    code, details, _ = _raw(channel, "Execute", big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    _assert_healthy(served, channel)


def test_oversized_script_is_refused_from_its_size(served, channel):
    data = pb.ExecuteRequest(script="#" * (8 << 20)).SerializeToString()
    code, details, _ = _raw(channel, "Execute", data)
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        f"script: larger than {MAX_SCRIPT_BYTES} bytes",
    )


def test_request_of_millions_of_tiny_fields_is_refused_before_decoding(served, channel):
    # Protobuf's decoder, on the server's event loop, took seconds over such a request.
    data = b"\x08\x01" * (4 << 20)  # 4 million times field 1 as a varint
    code, details, _ = _raw(channel, "Execute", data)
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "ExecuteRequest: more than 10000 fields (a valid request has a few thousand at most)",
    )


def test_unauthenticated_unary_call_is_refused_unread(served, channel):
    data = pb.ExecuteRequest(script="#" * (8 << 20)).SerializeToString()
    for metadata in ([], [("authorization", "Bearer nobody")]):
        code, details, _ = _raw(channel, "Execute", data, metadata)
        assert code == grpc.StatusCode.UNAUTHENTICATED, details
    _assert_healthy(served, channel)


@pytest.mark.parametrize("where", ["embedded", "server"])
def test_ptc_run_limit_below_minimum(served, where):
    extra = ["--server", served.address, "--api-key", "key-alpha"] if where == "server" else []
    proc = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--limit", "memory=1000", "--json", *extra],
        cwd=ROOT,
        input="print(1)",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "limit memory: 1000 bytes is below the minimum of 33554432 bytes" in proc.stderr
