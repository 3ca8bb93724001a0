"""A cell refused before it runs never ends its session; a session that does end names why.

Through a real `ptc serve` (one per module, SQLite audit store): a cell refused by the tenant's
rate limit (the recipe of issue 38: ``rate_per_minute = 4``, one session, cells 1-4 run, the
next ones refused), by its concurrency limit (``max_concurrent = 1``, ``queue = 0``, another
execution running) or as a bad request gets its own gRPC error, exactly, on every path a cell
takes (unary and streamed, with and without an idempotency key), and the session is untouched:
the cell after the refusals reads the variables the earlier cells set, and the session lists
only the cells that ran. The SDK's session object sees the same. A session that ends by its
own limit (its memory) says which cell and which limit, at what value.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox._proto import sandbox_pb2 as pb
from sandbox.client import Client
from sandbox.errors import ResourceExhausted
from sandbox.server.fleet import DRAINING_MESSAGE, READINESS_SERVICE
from sandbox.tenants import hash_key
from tests.ptc_serve import Serving, ptc_serve, start_serve, stop_serve

from .refusals import CALLS, Raw, refused, wait_until

KEYS = {
    t: f"ptc-test-key-refused-{t}-0123456789" for t in ("paced", "single", "queued", "acme", "sdk")
}
TENANTS = f"""
[[tenant]]
id = "paced"
keys = ["{hash_key(KEYS["paced"])}"]
rate_per_minute = 4

[[tenant]]
id = "single"
keys = ["{hash_key(KEYS["single"])}"]
max_concurrent = 1
queue = 0

[[tenant]]
id = "queued"
keys = ["{hash_key(KEYS["queued"])}"]
max_concurrent = 1
queue = 1

[[tenant]]
id = "acme"
keys = ["{hash_key(KEYS["acme"])}"]

[[tenant]]
id = "sdk"
keys = ["{hash_key(KEYS["sdk"])}"]
rate_per_minute = 60
rate_burst = 2
"""
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tmp = tmp_path_factory.mktemp("refused-cells")
    (tmp / "tenants.toml").write_text(TENANTS)
    with ptc_serve("--tenants", str(tmp / "tenants.toml"), "--pool-size", "1") as serving:
        yield serving


@pytest.fixture
def raw(server: Serving, request: pytest.FixtureRequest) -> Iterator[Raw]:
    made = Raw(server.address, KEYS[request.param])
    yield made
    made.close()


def _retry_in(message: str) -> float:
    found = re.search(r"retry in ([0-9.]+) s", message)
    assert found is not None, message
    return float(found.group(1))


def _ran(raw: Raw, session_id: str, script: str) -> str:
    result = CALLS["unary"](raw, session_id, script)
    assert result.status == pb.EXECUTION_STATUS_OK, result
    return str(result.stdout)


@pytest.mark.parametrize("raw", ["paced"], indirect=True)
def test_the_rate_limit_refuses_the_cell_and_the_session_keeps_its_state(raw: Raw) -> None:
    session_id = raw.create()
    outputs = [_ran(raw, session_id, "x = 1\nprint(x)")]
    outputs += [_ran(raw, session_id, "x += 1\nprint(x)") for _ in range(3)]
    assert outputs == ["1\n", "2\n", "3\n", "4\n"]
    refusals = {
        name: refused(lambda send=send: send(raw, session_id, "x += 100\nprint(x)"))  # type: ignore[misc]
        for name, send in CALLS.items()
    }
    for name, (code, message) in refusals.items():
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, message)
        assert message.startswith(
            "tenant paced: rate limit of 4 executions per minute reached; retry in "
        ), (name, message)
    info = raw.get(session_id)
    assert (info.state, info.end_reason) == (pb.SESSION_STATE_ACTIVE, "")
    assert len(info.execution_ids) == 4  # the refused cells are none of its cells
    time.sleep(_retry_in(refusals["stream-keyed"][1]) + 0.2)
    assert _ran(raw, session_id, "print(x)") == "4\n"  # none of the refused cells ran
    closed = raw.close_session(session_id)
    assert (closed.state, closed.end_reason) == (pb.SESSION_STATE_CLOSED, "closed by the client")
    assert len(closed.execution_ids) == 5


@pytest.mark.parametrize("raw", ["single"], indirect=True)
def test_the_concurrency_limit_refuses_the_cell_and_the_session_keeps_its_state(
    raw: Raw,
) -> None:
    session_id = raw.create()
    assert _ran(raw, session_id, "x = 'kept'\nprint(x)") == "kept\n"
    slow: list[pb.ExecutionResult] = []
    other = threading.Thread(target=lambda: slow.append(raw.unary(pb.ExecuteRequest(script=_SLOW))))
    other.start()
    try:
        wait_until("the other execution runs", lambda: _running(raw, session_id) == 1)
        refusals = {
            name: refused(lambda send=send: send(raw, session_id, "x = 'lost'"))  # type: ignore[misc]
            for name, send in CALLS.items()
        }
    finally:
        other.join(60)
    assert [r.stdout for r in slow] == ["slept\n"]
    for name, (code, message) in refusals.items():
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, message)
        assert message == (
            "tenant single: 1 executions running (the maximum) and 0 waiting (the queue is full)"
        ), name
    assert _ran(raw, session_id, "print(x)") == "kept\n"
    info = raw.close_session(session_id)
    assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_CLOSED, 2)


_SLOW = "import time\ntime.sleep(3)\nprint('slept')"


@pytest.mark.parametrize("raw", ["queued"], indirect=True)
def test_a_cell_whose_caller_leaves_while_it_queues_leaves_the_session_as_it_was(
    raw: Raw,
) -> None:
    """Queued behind another execution (``max_concurrent = 1``, ``queue = 1``), the cell's
    deadline passes: it leaves the queue with nothing admitted, and the session is as it was."""
    session_id = raw.create()
    assert _ran(raw, session_id, "x = 'kept'\nprint(x)") == "kept\n"
    slow: list[pb.ExecutionResult] = []
    other = threading.Thread(target=lambda: slow.append(raw.unary(pb.ExecuteRequest(script=_SLOW))))
    other.start()
    try:
        wait_until("the other execution runs", lambda: _running(raw, session_id) == 1)
        request = pb.ExecuteRequest(script="x = 'lost'", session_id=session_id)
        code, _ = refused(lambda: raw.stub.Execute(request, metadata=raw.metadata, timeout=0.5))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        # The server sees the call end, the cell leaves the queue and releases the session,
        # while the other execution still runs.
        wait_until("the cell leaves", lambda: raw.get(session_id).running_execution_id == "")
        info = raw.get(session_id)
        assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_ACTIVE, 1)
        assert not slow
    finally:
        other.join(60)
    assert [r.stdout for r in slow] == ["slept\n"]
    assert _ran(raw, session_id, "print(x)") == "kept\n"
    info = raw.close_session(session_id)
    assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_CLOSED, 2)


def _running(raw: Raw, session_id: str) -> int:
    """Executions running, not counting the session's own record (open while it is)."""
    page = raw.stub.ListExecutions(
        pb.ListExecutionsRequest(running=True), metadata=raw.metadata, timeout=10
    )
    return len([r for r in page.records if r.result.execution_id != session_id])


@pytest.mark.parametrize("raw", ["acme"], indirect=True)
def test_a_bad_request_is_refused_and_the_session_keeps_its_state(raw: Raw) -> None:
    session_id = raw.create(limits=pb.Limits(memory_bytes=128 * MiB))
    assert _ran(raw, session_id, "x = 7\nprint(x)") == "7\n"
    below = pb.Limits(memory_bytes=64 * MiB)
    bad = {
        "limits": pb.ExecuteRequest(script="x = 0", session_id=session_id, limits=below),
        "argument": pb.ExecuteRequest(
            script="x = 0", session_id=session_id, labels={"ptc.session_id": "s-other"}
        ),
    }
    for streamed in (False, True):
        send = raw.stream if streamed else raw.unary
        code, message = refused(lambda: send(bad["limits"]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == (
            "limits.memory: 67108864 bytes is below the 134217728 bytes of session "
            f"{session_id!r}, set for its whole sandbox at CreateSession; a cell cannot lower it"
        )
        code, message = refused(lambda: send(bad["argument"]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message == (
            "labels: key 'ptc.session_id' is reserved: keys starting with 'ptc.' are set by "
            "the server"
        )
    assert _ran(raw, session_id, "print(x)") == "7\n"
    info = raw.close_session(session_id)
    assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_CLOSED, 2)


@pytest.mark.parametrize("raw", ["acme"], indirect=True)
def test_a_session_ended_by_its_memory_limit_names_the_cell_and_the_limit(raw: Raw) -> None:
    session_id = raw.create(limits=pb.Limits(memory_bytes=128 * MiB))
    assert _ran(raw, session_id, "x = 1") == ""
    oom = CALLS["unary"](
        raw, session_id, "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 1024 * 1024))"
    )
    limit = "memory: the sandbox ran out of memory (its limit of 134217728 bytes) and was killed"
    assert oom.session_lost == limit
    reason = f"cell 2 (execution id {oom.execution_id}): {limit}"
    code, message = refused(lambda: CALLS["stream"](raw, session_id, "x"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert message == f"session_lost: session {session_id!r} is lost: {reason}"
    info = raw.get(session_id)
    assert (info.state, info.end_reason) == (pb.SESSION_STATE_LOST, reason)
    record = raw.stub.GetExecution(
        pb.GetExecutionRequest(execution_id=session_id), metadata=raw.metadata, timeout=10
    )
    assert record.result.error.message == f"lost: {reason}"


def test_the_sdk_session_object_keeps_its_state_across_a_refused_cell(server: Serving) -> None:
    with Client(server.address, KEYS["sdk"]) as client, client.session() as session:
        assert session.execute("x = 'first'\nprint(x)").stdout == "first\n"
        assert session.execute("y = 2").status == "ok"
        with pytest.raises(ResourceExhausted) as caught:
            session.execute("x = 'refused'")
        assert caught.value.message.startswith(
            "tenant sdk: rate limit of 60 executions per minute reached; retry in "
        )
        time.sleep(_retry_in(caught.value.message) + 0.2)
        after = session.execute("print(x, y)")
        assert (after.status, after.stdout) == ("ok", "first 2\n")
        info = session.get()
        assert (info.state, len(info.execution_ids)) == ("active", 3)
        assert info.execution_ids[-1] == after.execution_id


def test_a_cell_refused_while_the_server_drains_continues_on_the_next_server(
    tmp_path: Path,
) -> None:
    """SIGTERM with an execution in flight: the server drains (its grace) and refuses the
    session's cells with UNAVAILABLE, then hands the session over; a server started on the same
    SQLite store rebuilds it, and the next cell reads what the first one set."""
    (tmp_path / "tenants.toml").write_text(TENANTS)
    common = ("--audit-db", str(tmp_path / "audit.db"), "--tenants", str(tmp_path / "tenants.toml"))
    proc, first = start_serve(*common, "--pool-size", "1", "--grace", "30")
    raw = Raw(first.address, KEYS["acme"])
    try:
        session_id = raw.create()
        assert _ran(raw, session_id, "x = 'kept'\nprint(x)") == "kept\n"
        slow: list[pb.ExecutionResult] = []
        other = threading.Thread(
            target=lambda: slow.append(raw.unary(pb.ExecuteRequest(script=_SLOW)))
        )
        other.start()
        try:
            wait_until("the other execution runs", lambda: _running(raw, session_id) == 1)
            proc.send_signal(signal.SIGTERM)
            wait_until("the server drains", lambda: not _ready(first.address))
            refusals = {
                name: refused(lambda send=send: send(raw, session_id, "x = 'lost'"))  # type: ignore[misc]
                for name, send in CALLS.items()
            }
        finally:
            other.join(60)
        assert proc.wait(60) == 0
    finally:
        raw.close()
        stderr = stop_serve(proc)
    assert "Traceback" not in stderr, stderr
    assert [r.stdout for r in slow] == ["slept\n"]  # the drain let it finish
    for name, (code, message) in refusals.items():
        assert (code, message) == (grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE), name
    with ptc_serve(*common, "--pool-size", "1") as second:
        again = Raw(second.address, KEYS["acme"])
        try:
            assert _ran(again, session_id, "print(x)") == "kept\n"
            info = again.close_session(session_id)
        finally:
            again.close()
    assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_CLOSED, 2)


def _ready(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=10
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
