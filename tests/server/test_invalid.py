"""Every malformed request field is answered with INVALID_ARGUMENT and a message naming it, and
the server keeps serving."""

from __future__ import annotations

import time
import uuid
from typing import cast

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from tests.server.server_support import manifest

ECHO = manifest(("echo_it", "echo", {"x": {"type": "integer"}}))
CLIENT = manifest(("ask", "client", {}))


def _request(**fields) -> pb.ExecuteRequest:
    fields.setdefault("script", "print(1)")
    return pb.ExecuteRequest(**fields)


EXECUTE_CASES = [
    ("script-too-large", _request(script="#" * (1024 * 1024 + 1)), "script: "),
    ("manifest-not-json", _request(manifest=pb.ToolManifest(json="{nope")), "manifest: "),
    (
        "manifest-bad-schema",
        _request(
            manifest=pb.ToolManifest(
                json='[{"name": "a", "parameters": {"type": "object"}},'
                ' {"name": "b", "parameters": {"type": 7}}]'
            )
        ),
        "manifest: tool 'b' at $[1].parameters.type",
    ),
    (
        "manifest-unknown-option",
        _request(
            manifest=pb.ToolManifest(json='[{"name": "a", "x-ptc": {"needs_aproval": true}}]')
        ),
        "manifest: ",
    ),
    (
        "client-tool-in-unary",
        _request(manifest=pb.ToolManifest(json=CLIENT)),
        "manifest: tools[0] 'ask': is a 'client'-mode tool",
    ),
    (
        "host-tool-without-handler",
        _request(manifest=pb.ToolManifest(json=manifest(("nobody", "host", {})))),
        "manifest: tools[0] 'nobody': is in 'host' mode",
    ),
    (
        "host-tool-naming-other-handler",
        _request(
            manifest=pb.ToolManifest(json=manifest(("add", "host", {}, {"handler": "os:system"})))
        ),
        "manifest: tools[0] 'add': names handler 'os:system'",
    ),
    ("memory-zero", _request(limits=pb.Limits(memory_bytes=0)), "limits.memory_bytes: "),
    ("wall-time-zero", _request(limits=pb.Limits(wall_time_ms=0)), "limits.wall_time_ms: "),
    ("tool-calls-zero", _request(limits=pb.Limits(max_tool_calls=0)), "limits.max_tool_calls: "),
    ("backend-unknown", _request(backend=99), "backend: unknown value 99"),
    ("policy-unknown", _request(policy=42), "policy: unknown value 42"),
    (
        "expected-calls-unknown-tool",
        _request(
            manifest=pb.ToolManifest(json=ECHO),
            expected_calls=[pb.ExpectedCalls(tool="echo_it"), pb.ExpectedCalls(tool="zzz")],
        ),
        "expected_calls[1].tool: unknown tool 'zzz'",
    ),
    (
        "expected-calls-empty-tool",
        _request(expected_calls=[pb.ExpectedCalls(tool="")]),
        "expected_calls[0].tool: is empty",
    ),
    (
        "expected-calls-min-above-max",
        _request(
            manifest=pb.ToolManifest(json=ECHO),
            expected_calls=[pb.ExpectedCalls(tool="echo_it", min=3, max=1)],
        ),
        "expected_calls[0]: min 3 is above max 1",
    ),
    ("label-key-empty", _request(labels={"": "x"}), "labels: key"),
    ("label-value-long", _request(labels={"k": "v" * 2000}), "labels['k']: longer than"),
    ("too-many-labels", _request(labels={f"k{i}": "v" for i in range(65)}), "labels: more than"),
    (
        "label-key-reserved",
        _request(labels={"ptc.session_id": "s-forged"}),
        "labels: key 'ptc.session_id' is reserved: keys starting with 'ptc.' are set by the server",
    ),
]


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.SandboxServiceStub(channel)


def _details(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


@pytest.mark.parametrize(
    ("request_", "needle"), [c[1:] for c in EXECUTE_CASES], ids=[c[0] for c in EXECUTE_CASES]
)
def test_execute_invalid_field(server, stub, request_, needle):
    code, details = _details(lambda: stub.Execute(request_))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(needle) or needle in details, details


@pytest.mark.parametrize(
    ("request_", "needle"),
    [c[1:] for c in EXECUTE_CASES if c[0] != "client-tool-in-unary"],
    ids=[c[0] for c in EXECUTE_CASES if c[0] != "client-tool-in-unary"],
)
def test_stream_start_invalid_field(server, stub, request_, needle):
    def call():
        return list(stub.ExecuteStream(iter([pb.ClientMessage(start=request_)])))

    code, details = _details(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in details, details


STREAM_CASES = [
    (
        "first-message-not-start",
        [pb.ClientMessage(cancel=pb.Cancel())],
        "start: the first message must be `start`",
    ),
    (
        "empty-message",
        [pb.ClientMessage(start=_request(script="import time; time.sleep(3)")), pb.ClientMessage()],
        "message: empty",
    ),
    (
        "start-twice",
        [pb.ClientMessage(start=_request(script="import time; time.sleep(3)"))] * 2,
        "start: sent twice",
    ),
    (
        "answer-to-unknown-seq",
        [
            pb.ClientMessage(start=_request(script="import time; time.sleep(3)")),
            pb.ClientMessage(tool_answer=pb.ToolCallAnswer(seq=7, result_json="1")),
        ],
        "tool_answer.seq: no call 7",
    ),
    (
        "answer-without-outcome",
        [
            pb.ClientMessage(start=_request(script="import time; time.sleep(3)")),
            pb.ClientMessage(tool_answer=pb.ToolCallAnswer(seq=1)),
        ],
        "tool_answer.outcome: ",
    ),
    (
        "approval-to-unknown-seq",
        [
            pb.ClientMessage(start=_request(script="import time; time.sleep(3)")),
            pb.ClientMessage(approval=pb.ApprovalDecision(seq=3, approved=True)),
        ],
        "approval.seq: no call 3",
    ),
]


@pytest.mark.parametrize(
    ("messages", "needle"), [c[1:] for c in STREAM_CASES], ids=[c[0] for c in STREAM_CASES]
)
def test_stream_invalid_message(server, stub, messages, needle):
    code, details = _details(lambda: list(stub.ExecuteStream(iter(messages))))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in details, details


OTHER_CASES = [
    ("get-empty-id", "GetExecution", pb.GetExecutionRequest(), "execution_id: is empty"),
    ("stubs-no-manifest", "GenerateStubs", pb.GenerateStubsRequest(), "manifest: is required"),
    (
        "stubs-bad-manifest",
        "GenerateStubs",
        pb.GenerateStubsRequest(manifest=pb.ToolManifest(json="[1]")),
        "manifest: ",
    ),
    ("list-page-size", "ListExecutions", pb.ListExecutionsRequest(page_size=5000), "page_size: "),
    ("list-page-token", "ListExecutions", pb.ListExecutionsRequest(page_token="x"), "page_token: "),
    (
        "list-status",
        "ListExecutions",
        pb.ListExecutionsRequest(status=cast(pb.ExecutionStatus, 77)),
        "status: unknown",
    ),
    (
        "list-running-and-status",
        "ListExecutions",
        pb.ListExecutionsRequest(running=True, status=pb.EXECUTION_STATUS_OK),
        "running: set together with status; ask for one",
    ),
    ("list-violation", "ListExecutions", pb.ListExecutionsRequest(violation="nope"), "violation: "),
    (
        "list-until-before-since",
        "ListExecutions",
        pb.ListExecutionsRequest(since={"seconds": 100}, until={"seconds": 50}),
        "until: is before since",
    ),
]


@pytest.mark.parametrize(
    ("method", "request_", "needle"), [c[1:] for c in OTHER_CASES], ids=[c[0] for c in OTHER_CASES]
)
def test_other_invalid_field(server, stub, method, request_, needle):
    code, details = _details(lambda: getattr(stub, method)(request_))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(needle), details


def test_invalid_streams_are_recorded_cancelled_and_server_healthy(server, stub):
    """A stream aborted for a bad message after its start still leaves a cancelled record.

    The test sends its own aborted streams, each with a script marked by a token of its own, so
    it depends on no other test having run before it (or on none having run)."""
    token = uuid.uuid4().hex
    script = f"import time; time.sleep(3)  # {token}"
    after_start = [c for c in STREAM_CASES if c[1][0].HasField("start")]
    for case_id, messages, needle in after_start:
        first = pb.ClientMessage(start=_request(script=script))
        code, details = _details(lambda: list(stub.ExecuteStream(iter([first, *messages[1:]]))))
        assert (code, needle in details) == (grpc.StatusCode.INVALID_ARGUMENT, True), (
            case_id,
            details,
        )
    for _ in range(500):  # the cancelled runs complete their records as their sandboxes die
        records = stub.ListExecutions(pb.ListExecutionsRequest(page_size=1000)).records
        aborted = [r for r in records if r.script == script]
        if len(aborted) == len(after_start) and all(
            r.result.status != pb.EXECUTION_STATUS_UNSPECIFIED for r in aborted
        ):
            break
        time.sleep(0.01)
    assert len(after_start) == 5
    assert [r.result.status for r in aborted] == [pb.EXECUTION_STATUS_CANCELLED] * 5
    server.assert_healthy()
