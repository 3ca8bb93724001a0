"""Idempotency keys on one real server (the in-memory store; tests/fleet/ has the fleet on
PostgreSQL behind nginx): a key already admitted answers with that execution, unary or streamed,
and a keyed unary call that goes away before its deadline leaves its execution running."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import ExecutionQuery
from sandbox.client.aio import AsyncClient
from sandbox.errors import InvalidArgument

RANDOM = "import uuid\nprint(uuid.uuid4())\n"


def test_an_admitted_key_answers_with_its_execution(server):
    key = f"k-{uuid.uuid4()}"
    first = server.client.execute(RANDOM, idempotency_key=key)
    again = server.client.execute(RANDOM, idempotency_key=key)
    # a second run would print another uuid
    assert (again.execution_id, again.stdout, again.status) == (
        first.execution_id,
        first.stdout,
        "ok",
    )
    streamed: list[bytes] = []
    by_stream = server.client.run(
        RANDOM, idempotency_key=key, on_output=lambda c: streamed.append(c.data)
    )
    assert (by_stream.execution_id, by_stream.stdout) == (first.execution_id, first.stdout)
    assert streamed == []  # the record's result only: nothing ran to stream output
    record = server.client.get_execution(first.execution_id)
    assert record.idempotency_key == key
    mine = [
        r
        for r in server.client.list_executions(ExecutionQuery(page_size=200)).records
        if r.idempotency_key == key
    ]
    assert len(mine) == 1


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "k" * 129,
            "idempotency_key: longer than 128 characters ('"
            + "k" * 64
            + "'... (65 more characters))",
        ),
        (
            "two words",
            "idempotency_key: 'two words' has a character outside printable ASCII (or a space)",
        ),
        (
            "cl\u00e9",
            "idempotency_key: 'cl\u00e9' has a character outside printable ASCII (or a space)",
        ),
    ],
    ids=["too-long", "space", "non-ascii"],
)
def test_a_bad_key_is_an_invalid_argument(server, key: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        server.client.execute("print(1)", idempotency_key=key)
    assert info.value.message == message
    server.assert_healthy()


def test_a_keyed_call_gone_before_its_deadline_runs_to_its_end(server):
    key = f"k-{uuid.uuid4()}"
    script = "import time\ntime.sleep(1.5)\nprint('ran to the end')\n"

    async def main(client: AsyncClient) -> tuple[str, str]:
        request = pb.ExecuteRequest(script=script, idempotency_key=key)
        call = client._stub.Execute(request, timeout=60)
        while not any(r.status == "running" for r in (await client.list_executions()).records):
            await asyncio.sleep(0.05)
        call.cancel()  # as a balancer that gave up resets it
        result = await client.execute(script, idempotency_key=key)
        return str(result.status), result.stdout

    assert server.run_async(main) == ("ok", "ran to the end\n")
