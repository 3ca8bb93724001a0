"""Large results through a real `ptc serve`: a call log the limits allow and output as large as
the limits allow reach the client as a result (not RESOURCE_EXHAUSTED), and the audit store
grows by no more than the limits allow per execution."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client import Client
from tests.ptc_serve import ptc_serve

MiB = 1 << 20
ECHO = json.dumps(
    [{"name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}]
)
MEGABYTE_ECHOES = """
import tools
ok = refused = 0
for i in range(64):
    try:
        tools.echo(text="y" * 1_000_000)
        ok += 1
    except tools.CallRefused:
        refused += 1
print(ok, refused)
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    db = tmp_path / "audit.db"
    with ptc_serve("--pool-size", "1", "--audit-db", str(db)) as serving:
        yield serving.address, db


def _record_bytes(address: str, execution_id: str) -> int:
    """The size of the audit record as the server sends it."""
    with grpc.insecure_channel(
        address, options=[("grpc.max_receive_message_length", 64 * MiB)]
    ) as channel:
        stub = pb_grpc.SandboxServiceStub(channel)
        record = stub.GetExecution(pb.GetExecutionRequest(execution_id=execution_id), timeout=30)
    size: int = record.ByteSize()
    return size


def _store_bytes(db: Path) -> int:
    """The database's logical size (its committed pages, the write-ahead log's included)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        (pages,) = conn.execute("PRAGMA page_count").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    return int(pages) * int(size)


def test_megabyte_echoes_come_back_as_a_result_and_a_bounded_record(
    server: tuple[str, Path],
) -> None:
    address, db = server
    with Client(address) as client:
        assert client.execute("print('warm')").stdout == "warm\n"
        before = _store_bytes(db)
        result = client.execute(MEGABYTE_ECHOES, ECHO)
        grown = _store_bytes(db) - before
        assert (result.status, result.stdout) == ("limit_exceeded", "4 60\n")
        assert [(v.limit, v.limit_value, v.action) for v in result.violations] == [
            ("call_log_bytes", 8 * MiB, "refused")
        ]
        assert [c.status for c in result.calls] == ["ok"] * 4 + ["refused"] * 60
        record = client.get_execution(result.execution_id)
        assert _record_bytes(address, result.execution_id) < 9 * MiB
        assert record.result is not None and len(record.result.calls) == 64
        # The record (its calls, output and index rows) is one bounded write, not 128 MB.
        assert 4 * MiB < grown < 10 * MiB
        assert client.execute("print('still ok')").stdout == "still ok\n"


def test_output_as_large_as_the_limits_allow_reaches_the_client(server: tuple[str, Path]) -> None:
    """Bytes that are not UTF-8 come back as U+FFFD, three bytes each: 12 MiB of them make a
    36 MiB result, past gRPC's usual 32 MiB message limit."""
    address, _ = server
    with Client(address) as client:
        result = client.execute(
            f"import sys\nsys.stdout.buffer.write(b'\\xff' * {12 * MiB})",
            limits={"stdout_bytes": 12 * MiB},
        )
        assert (result.status, result.violations) == ("ok", [])
        assert result.stdout == "\ufffd" * (12 * MiB)
        assert result.usage.stdout_bytes == 12 * MiB
        assert client.execute("print('still ok')").stdout == "still ok\n"


def test_megabyte_echoes_through_the_stream_come_back_as_a_result(
    server: tuple[str, Path],
) -> None:
    """The same bound through ExecuteStream (`Client.run`, the client in the loop): the stream's
    final result frame carries the violation and every call, within gRPC's message limit."""
    address, _ = server
    streamed: list[bytes] = []
    with Client(address) as client:
        result = client.run(MEGABYTE_ECHOES, ECHO, on_output=lambda c: streamed.append(c.data))
        assert (result.status, result.stdout) == ("limit_exceeded", "4 60\n")
        assert b"".join(streamed) == b"4 60\n"  # the output came as it was written, too
        [violation] = result.violations
        assert (violation.limit, violation.limit_value, violation.action, violation.evidence) == (
            "call_log_bytes",
            8 * MiB,
            "refused",
            "host",
        )
        # What the log would have held: 64 calls' arguments of a megabyte each, and more.
        assert violation.observed is not None and violation.observed > 64 * 1_000_000
        assert "60 calls refused" in violation.detail
        assert len(result.calls) == 64
        assert [c.status for c in result.calls] == ["ok"] * 4 + ["refused"] * 60
        assert [c.seq for c in result.calls] == list(range(1, 65))
        assert result.usage.tool_calls == 64
        record = client.get_execution(result.execution_id)
        assert record.result is not None and len(record.result.calls) == 64
        assert _record_bytes(address, result.execution_id) < 9 * MiB
        assert client.run("print('still ok')").stdout == "still ok\n"
