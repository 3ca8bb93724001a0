"""ExecuteStream through the client SDK: output, client-side tools, approvals, cancellation."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import (
    ApprovalRequest,
    AsyncClient,
    ExecutionQuery,
    ExecutionRecord,
    OutputChunk,
    tool,
)
from sandbox.errors import PtcError
from sandbox.records import RUNNING
from sandbox.result import ExecutionResult
from tests.server.conftest import ServerHarness
from tests.server.server_support import manifest


@tool(read_only=True)
def double(n: int) -> int:
    """Doubles a number.

    Args:
        n: the number.
    """
    return n * 2


@tool
def explode(reason: str) -> None:
    """Always fails on the client."""
    raise RuntimeError(f"client tool failed: {reason}")


def _wait_completed(server: ServerHarness, execution_id: str) -> ExecutionRecord:
    for _ in range(1000):
        record = server.client.get_execution(execution_id)
        if record.status != RUNNING:
            return record
        time.sleep(0.01)
    raise AssertionError(f"{execution_id} never completed")


def test_streamed_output_callback_and_iterator(server):
    script = "import sys\nprint('out1', flush=True)\nprint('err1', file=sys.stderr, flush=True)"
    seen: list[OutputChunk] = []
    result = server.client.run(script, on_output=seen.append)
    assert result.status == "ok"
    assert b"".join(c.data for c in seen if c.stream == "stdout") == b"out1\n"
    assert b"".join(c.data for c in seen if c.stream == "stderr") == b"err1\n"

    execution = server.client.stream("for i in range(3): print(i, flush=True)")
    chunks = list(execution)
    assert b"".join(c.data for c in chunks) == b"0\n1\n2\n"
    assert execution.result().stdout == "0\n1\n2\n"


def test_events_reach_the_client_in_the_order_the_script_made_them(server):
    # Output written before a tool call must arrive before that call's request, although
    # output is sent from a callback and the call's request by the task making it.
    seen: list[str] = []

    @tool(read_only=True)
    async def mark(i: int) -> int:
        """Records that call ``i`` reached the client."""
        seen.append(f"call {i}")
        return i

    script = (
        "import tools\n"
        "for i in range(20):\n"
        "    print(f'out {i}', flush=True)\n"
        "    assert tools.mark(i=i) == i\n"
        "print('end', flush=True)\n"
    )

    def on_output(chunk: OutputChunk) -> None:
        seen.extend(line for line in chunk.data.decode().splitlines() if line)

    result = server.client.run(script, tools=[mark], on_output=on_output)
    assert result.status == "ok", result.stderr
    expected = [item for i in range(20) for item in (f"out {i}", f"call {i}")] + ["end"]
    assert seen == expected


def test_client_tool_result_flows_back_into_the_script(server):
    script = "import tools\nx = tools.double(n=21)\nprint(x, type(x).__name__)"
    result = server.client.run(script, tools=[double])
    assert result.status == "ok", result.stderr
    assert result.stdout == "42 int\n"
    assert [(c.tool, c.status, c.result) for c in result.calls] == [("double", "ok", 42)]


def test_client_tool_that_raises_is_a_typed_error_in_the_script(server):
    script = (
        "import tools\n"
        "try:\n"
        "    tools.explode(reason='boom')\n"
        "except tools.ToolError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    result = server.client.run(script, tools=[explode])
    assert result.status == "ok", result.stderr
    assert result.stdout == "ToolError | RuntimeError: client tool failed: boom\n"
    assert result.calls[0].status == "error"
    assert result.calls[0].error == "RuntimeError: client tool failed: boom"


def test_client_tool_arguments_are_validated_by_the_schema(server):
    script = (
        "import tools\n"
        "try:\n"
        "    tools.double(n='x')\n"
        "except tools.InvalidArguments as e:\n"
        "    print('invalid')\n"
    )
    result = server.client.run(script, tools=[double])
    assert result.stdout == "invalid\n"
    assert result.calls[0].status == "invalid_arguments"


APPROVAL_TOOLS = json.loads(
    manifest(("transfer", "echo", {"amount": {"type": "integer"}}, {"needs_approval": True}))
)
APPROVAL_SCRIPT = (
    "import tools\n"
    "for amount in (5, 500):\n"
    "    try:\n"
    "        print('ok', tools.transfer(amount=amount))\n"
    "    except tools.CallDenied as e:\n"
    "        print('denied', e)\n"
)


def test_approvals_granted_and_denied(server):
    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> tuple[bool, str]:
        asked.append(request)
        return (request.arguments["amount"] < 100, "too much")

    result = server.client.run(APPROVAL_SCRIPT, tools=APPROVAL_TOOLS, approve=approve)
    assert result.status == "ok", result.stderr
    assert result.stdout == "ok {'amount': 5}\ndenied the call was denied: too much\n"
    assert [(a.tool, a.arguments) for a in asked] == [
        ("transfer", {"amount": 5}),
        ("transfer", {"amount": 500}),
    ]
    assert [c.status for c in result.calls] == ["ok", "denied"]
    record = server.client.get_execution(result.execution_id)
    assert [c.status for c in record.result.calls] == ["ok", "denied"]


def test_approval_with_async_approver_and_client_tool(server):
    @tool(needs_approval=True)
    async def launch(target: str) -> str:
        """Launches something."""
        return f"launched {target}"

    async def approve(request: ApprovalRequest) -> bool:
        await asyncio.sleep(0)
        target: str = request.arguments["target"]
        return target == "moon"

    script = (
        "import tools\n"
        "print(tools.launch(target='moon'))\n"
        "try:\n"
        "    tools.launch(target='earth')\n"
        "except tools.CallDenied:\n"
        "    print('denied')\n"
    )
    result = server.run_async(lambda c: c.run(script, tools=[launch], approve=approve))
    assert result.stdout == "launched moon\ndenied\n"


def test_unary_execute_denies_approval_tools(server):
    result = server.client.execute(APPROVAL_SCRIPT, APPROVAL_TOOLS)
    assert [c.status for c in result.calls] == ["denied", "denied"]


def test_hundred_concurrent_streams_route_every_result(server):
    @tool(read_only=True)
    async def tag(execution: int, i: int) -> str:
        """Tags a value with the execution it belongs to."""
        await asyncio.sleep(0.001 * (i % 3))
        return f"{execution}:{i}"

    def script(n: int) -> str:
        return (
            "import asyncio, tools\n"
            f"got = await asyncio.gather(*(tools.aio.tag(execution={n}, i=i) for i in range(5)))\n"
            "print(','.join(got))\n"
        )

    async def main(client: AsyncClient) -> list[ExecutionResult]:
        return await asyncio.gather(*(client.run(script(n), tools=[tag]) for n in range(100)))

    results = server.run_async(main)
    for n, result in enumerate(results):
        assert result.status == "ok", (n, result.stderr)
        assert result.stdout == ",".join(f"{n}:{i}" for i in range(5)) + "\n"
        assert len(result.calls) == 5
    assert len({r.execution_id for r in results}) == 100
    server.assert_healthy()


def test_cancel_message_mid_run_is_recorded_cancelled(server):
    async def main(client: AsyncClient):
        execution = await client.start("import time\nprint('started', flush=True)\ntime.sleep(30)")
        async for chunk in execution:
            assert chunk.data == b"started\n"
            await execution.cancel("user pressed stop")
            break
        return await execution.result()

    result = server.run_async(main)
    assert result.status == "cancelled"
    record = _wait_completed(server, result.execution_id)
    assert record.status == "cancelled"


def test_client_disconnect_mid_run_is_recorded_cancelled(server):
    async def main(client: AsyncClient) -> str:
        execution = await client.start("import time\nprint('started', flush=True)\ntime.sleep(30)")
        async for _chunk in execution:
            break
        waiting = asyncio.ensure_future(execution.result())
        await asyncio.sleep(0.05)
        waiting.cancel()  # cancels the RPC, as a client that goes away does
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return execution.execution_id

    execution_id = server.run_async(main)
    record = _wait_completed(server, execution_id)
    assert record.status == "cancelled"


def test_deadline_cancels_the_execution(server):
    with pytest.raises(PtcError) as info:
        server.client.execute("import time\ntime.sleep(30)", timeout=0.5)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.message.startswith("DEADLINE_EXCEEDED: ")
    listed = server.client.list_executions(ExecutionQuery(page_size=20))
    mine = [r for r in listed.records if r.script == "import time\ntime.sleep(30)"]
    record = _wait_completed(server, mine[0].execution_id)
    assert record.result is not None
    assert (record.status, record.result.status) == ("cancelled", "cancelled")


def test_client_that_never_answers_hits_the_wall_time_limit(server):
    script = "import tools\ntools.ask()"

    async def main(client: AsyncClient):
        # A manifest-only client tool: the SDK answers it, so bypass the SDK's answering
        # by talking to the stub directly and never sending the answer.
        request = pb.ExecuteRequest(
            script=script,
            manifest=pb.ToolManifest(json=manifest(("ask", "client", {}))),
            limits=pb.Limits(wall_time_ms=500),
        )
        call = client._stub.ExecuteStream()
        await call.write(pb.ClientMessage(start=request))
        events = []
        while isinstance(event := await call.read(), pb.ServerEvent):  # else the end (EOF)
            events.append(event)
        return events

    events = server.run_async(main)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and "tool_call" in kinds and kinds[-1] == "result"
    result = events[-1].result
    assert result.status == pb.EXECUTION_STATUS_LIMIT_EXCEEDED
    assert [v.limit for v in result.violations] == ["wall_time"]
    assert result.calls[0].status == pb.CALL_STATUS_CANCELLED


def test_server_healthy_after_everything(server):
    server.assert_healthy()
