"""Unary Execute, the server-side tool modes, stubs, the audit RPCs, health and reflection."""

from __future__ import annotations

import json

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from sandbox.client import ExecutionQuery
from sandbox.errors import NotFound
from tests.server.server_support import manifest


def test_unary_print(server):
    result = server.client.execute("print(1)")
    assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "1\n")
    assert "netns:empty" in result.isolation
    assert result.effective_limits is not None
    assert result.effective_limits.wall_time_ms == 10_000


def test_failing_script_is_a_result_not_an_rpc_error(server):
    result = server.client.execute("raise ValueError('nope')")
    assert result.status == "error"
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("ValueError", "nope")


def test_syntax_error_is_rejected_result(server):
    result = server.client.execute("def (:")
    assert result.status == "rejected"
    assert result.error is not None and result.error.type == "SyntaxError"


def test_limit_violation_is_a_result(server):
    result = server.client.execute("import time\ntime.sleep(5)", limits={"wall_time_ms": 300})
    assert result.status == "limit_exceeded"
    assert [v.limit for v in result.violations] == ["wall_time"]


def test_echo_mock_and_host_tools(server):
    tools = manifest(
        ("echo_it", "echo", {"x": {"type": "integer"}}),
        ("fixed", "mock", {}, {"mock": {"answer": 42}}),
        ("add", "host", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
    )
    script = "import tools\nprint(tools.echo_it(x=1), tools.fixed(), tools.add(a=2, b=3))"
    result = server.client.execute(script, json.loads(tools))
    assert result.status == "ok", result.stderr
    assert result.stdout == "{'x': 1} {'answer': 42} 5\n"
    assert [c.status for c in result.calls] == ["ok", "ok", "ok"]


def test_host_handler_error_and_timeout_are_tool_errors(server):
    tools = manifest(("broken", "host", {}), ("slow", "host", {"seconds": {"type": "number"}}))
    script = (
        "import tools\n"
        "for f, kw in ((tools.broken, {}), (tools.slow, {'seconds': 3})):\n"
        "    try:\n"
        "        f(**kw)\n"
        "    except tools.ToolError as e:\n"
        "        print(type(e).__name__, e)\n"
    )
    result = server.client.execute(script, json.loads(tools))
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "ToolError RuntimeError: the host tool broke"
    assert lines[1].startswith("ToolError the host handler for 'slow' took longer than 1 s")


def test_get_and_list_executions(server):
    first = server.client.execute("print('a')", labels={"team": "qa"})
    record = server.client.get_execution(first.execution_id)
    assert (record.status, record.result.status) == ("ok", "ok")
    assert record.script == "print('a')"
    assert record.tenant == "default"
    assert dict(record.labels) == {"team": "qa"}
    assert len(record.record_hash) == 64
    listed = server.client.list_executions(ExecutionQuery(page_size=1))
    assert len(listed.records) == 1
    assert listed.next_page_token
    again = server.client.list_executions(
        ExecutionQuery(page_size=1, page_token=listed.next_page_token)
    )
    assert again.records[0].execution_id != listed.records[0].execution_id
    nothing = server.client.list_executions(ExecutionQuery(status="ok", tool="nope"))
    assert (nothing.records, nothing.next_page_token) == ([], "")


def test_unknown_execution_is_not_found(server):
    with pytest.raises(NotFound) as info:
        server.client.get_execution("0" * 32)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert info.value.message == f"execution_id: no execution {'0' * 32!r}"


def test_generate_stubs(server):
    def lookup(item_id: int) -> str:
        """Looks an item up."""
        return str(item_id)

    stubs = server.client.stubs([lookup])
    assert "def lookup(*, item_id: int) -> str:" in stubs.module
    assert "lookup" in stubs.compact
    assert stubs.names == {"lookup": "lookup"}
    assert len(stubs.manifest_hash) == 64


def test_health_and_reflection(server):
    assert server.health() == 1  # SERVING
    with grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for a in answers for s in a.list_services_response.service}
    assert "ptc.sandbox.v1.SandboxService" in names
    assert "grpc.health.v1.Health" in names
    server.assert_healthy()
