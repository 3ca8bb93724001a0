"""Sessions through a real gRPC server and the client SDK, on each backend: state kept across
executions, interrupts that keep the session, ends that lose it (OOM, an uninterruptible
cell, a cell's own exit), idle expiry, tenant isolation, bad input with exact codes, and the
audit chain."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.audit import open_store
from sandbox.audit.base import AuditQuery
from sandbox.client import AsyncClient, ExecutionQuery
from sandbox.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from sandbox.result import ExecutionResult

from .conftest import KEY_A, SessionServer

MiB = 1024 * 1024
_PARAMS = {"type": "object", "properties": {"q": {"type": "integer"}}}
ECHO = json.dumps([{"name": "lookup", "parameters": _PARAMS}])
ECHO2 = json.dumps([{"name": "search", "parameters": _PARAMS}])


def tripped(result: ExecutionResult) -> list[tuple[str, str]]:
    return [(v.limit, v.action) for v in result.violations]


def test_state_persists_across_three_executions(srv: SessionServer) -> None:
    with srv.a.session(ECHO, backend=srv.backend) as session:
        first = session.execute(
            "import json, tools\nx = 1\n_ = open('notes.txt', 'w').write('kept')"
        )
        second = session.execute("x += 1\nprint(x)\ntools.lookup(q=x)")
        third = session.execute(
            "print(x, json.dumps([x]), open('notes.txt').read())\nx * 10", ECHO2
        )
        fourth = session.execute("(hasattr(tools, 'search'), hasattr(tools, 'lookup'))")
        info = session.get()
    assert (first.status, first.stdout, first.value) == ("ok", "", None)
    assert (second.status, second.stdout, second.value) == ("ok", "2\n", "{'q': 2}")
    assert [(c.tool, c.arguments) for c in second.calls] == [("lookup", {"q": 2})]
    assert (third.status, third.stdout, third.value) == ("ok", "2 [2] kept\n", "20")
    assert (fourth.status, fourth.value) == ("ok", "(True, False)")
    assert {r.session_id for r in (first, second, third)} == {session.id}
    assert list(info.execution_ids) == [
        first.execution_id,
        second.execution_id,
        third.execution_id,
        fourth.execution_id,
    ]
    assert info.state == "active"
    closed = srv.a.session(session_id=session.id).get()
    assert (closed.state, closed.end_reason) == ("closed", "closed by the client")


def test_files_in_and_out_per_cell(srv: SessionServer) -> None:
    """Each cell gets its own inputs and returns only what it wrote or changed under outputs/
    during that cell; files persist in the session's working directory between cells."""
    data = bytes(range(256)) * 4
    with srv.a.session(backend=srv.backend) as session:
        first = session.execute(
            "rows = open('in.bin', 'rb').read()\n"
            "open('outputs/a.txt', 'w').write('one')\n"
            "open('outputs/b.bin', 'wb').write(rows[::-1])\n"
            "len(rows)",
            files={"in.bin": data},
        )
        second = session.execute(
            "open('outputs/a.txt', 'w').write('two')\n"
            "(open('in.bin', 'rb').read() == rows, open('more.txt').read())",
            files={"more.txt": b"second input"},
        )
        third = session.execute("import os\nsorted(os.listdir('outputs'))")
    assert (first.status, first.value) == ("ok", "1024"), first.to_json()
    assert {f.name: f.data for f in first.output_files} == {"a.txt": b"one", "b.bin": data[::-1]}
    assert [f.name for f in first.input_files] == ["in.bin"]
    assert (second.status, second.value) == ("ok", "(True, 'second input')"), second.to_json()
    assert {f.name: f.data for f in second.output_files} == {"a.txt": b"two"}
    assert (third.status, third.value, third.output_files) == ("ok", "['a.txt', 'b.bin']", [])


def test_single_use_execution_is_unchanged(srv: SessionServer) -> None:
    first = srv.a.execute("x = 1", backend=srv.backend)
    second = srv.a.execute("print(x)", backend=srv.backend)
    assert (first.status, first.session_id, first.value) == ("ok", "", None)
    assert (second.status, second.error.type if second.error else None) == ("error", "NameError")


def test_timed_out_execution_is_interrupted_and_the_session_lives(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend) as session:
        session.execute("x = 41")
        slow = session.execute("while True:\n    pass", limits={"wall_time_ms": 1000})
        after = session.execute("x + 1")
        sleepy = session.execute("import time\ntime.sleep(30)", limits={"wall_time_ms": 1000})
        again = session.execute("x + 2")
    assert slow.status == "limit_exceeded"
    assert tripped(slow) == [("wall_time", "interrupted")]
    assert slow.error is not None and slow.error.type == "KeyboardInterrupt"
    assert slow.session_lost == ""
    assert (after.status, after.value) == ("ok", "42")
    assert tripped(sleepy) == [("wall_time", "interrupted")]
    assert (again.status, again.value) == ("ok", "43")


def test_cpu_limit_per_execution_is_a_delta(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend) as session:
        burns = [
            session.execute(
                "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n"
                "    pass",
                limits={"cpu_time_ms": 1000},
            )
            for _ in range(3)
        ]
        spin = session.execute("while True:\n    pass", limits={"cpu_time_ms": 1000})
        alive = session.execute("'alive'")
    # 1.8 s of CPU in all, none of the three over its own 1 s.
    assert [b.status for b in burns] == ["ok", "ok", "ok"]
    assert tripped(spin) == [("cpu_time", "interrupted")]
    assert spin.violations[0].observed is not None and 1.0 <= spin.violations[0].observed < 2.0
    assert (alive.status, alive.value) == ("ok", "'alive'")


def test_uninterruptible_cell_is_killed_and_the_session_lost(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend) as session:
        stubborn = session.execute(
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
            limits={"wall_time_ms": 1000},
        )
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("print(1)")
    assert stubborn.status == "limit_exceeded"
    assert tripped(stubborn) == [("wall_time", "killed")]
    assert stubborn.session_lost == (
        "wall_time (its limit of 1 s): the execution did not stop within 1 s of its interrupt "
        "and the sandbox was killed"
    )
    assert str(lost.value) == (
        f"session_lost: session '{session.id}' is lost: cell 1 (execution id "
        f"{stubborn.execution_id}): {stubborn.session_lost}"
    )
    srv.assert_healthy()


def test_out_of_memory_ends_the_session_with_the_reason(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend, limits={"memory_bytes": 128 * MiB}) as session:
        session.execute("x = 1")
        oom = session.execute(
            "hoard = []\nwhile True:\n    hoard.append(bytearray(8 * 1024 * 1024))"
        )
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("x")
        info = session.get()
    assert oom.status == "limit_exceeded"
    assert ("memory", "killed") in tripped(oom)
    assert oom.session_lost == (
        "memory: the sandbox ran out of memory (its limit of 134217728 bytes) and was killed"
    )
    reason = f"cell 2 (execution id {oom.execution_id}): {oom.session_lost}"
    assert str(lost.value) == f"session_lost: session '{session.id}' is lost: {reason}"
    assert (info.state, info.end_reason) == ("lost", reason)
    srv.assert_healthy()


def test_a_cell_that_leaves_through_os_exit_reports_its_own_exit_code(srv: SessionServer) -> None:
    # The first cell's `end` frame said 0; the sandbox's exit must be read as it is (7), not
    # taken from that earlier, finished cell's report.
    with srv.a.session(backend=srv.backend) as session:
        first = session.execute("x = 1")
        gone = session.execute("import os\nos._exit(7)")
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("x")
        info = session.get()
    assert first.status == "ok"
    assert (gone.status, gone.exit_code, gone.violations) == ("error", 7, [])
    assert gone.error is not None and gone.error.type == "NoReport"
    assert gone.error.message.startswith("the script exited with code 7 without")
    assert gone.session_lost == "exited: the sandbox ended with exit code 7"
    reason = f"cell 2 (execution id {gone.execution_id}): {gone.session_lost}"
    assert str(lost.value) == f"session_lost: session '{session.id}' is lost: {reason}"
    assert (info.state, info.end_reason) == ("lost", reason)
    srv.assert_healthy()


def test_idle_session_expires(srv: SessionServer) -> None:
    session = srv.a.session(backend=srv.backend, idle_timeout=0.3)
    session.create()
    session.execute("x = 1")
    time.sleep(1.0)
    with pytest.raises(NotFound) as gone:
        session.execute("x")
    assert str(gone.value) == (
        f"session_lost: session '{session.id}' is expired: idle: no execution for 0.3 s"
    )
    assert session.get().state == "expired"
    with pytest.raises(NotFound):
        session.close()


def test_lifetime_and_max_executions(srv: SessionServer) -> None:
    counted = srv.a.session(backend=srv.backend, max_executions=2)
    counted.create()
    counted.execute("x = 1")
    counted.execute("x")
    with pytest.raises(NotFound) as spent:
        counted.execute("x")
    assert str(spent.value).endswith("is expired: max_executions: ran its 2 executions")
    short = srv.a.session(backend=srv.backend, max_lifetime=0.5)
    short.create()
    time.sleep(1.0)
    with pytest.raises(NotFound) as old:
        short.execute("1")
    assert str(old.value).endswith("is expired: lifetime: reached its maximum lifetime of 0.5 s")


def test_tenants_cannot_see_each_others_sessions(srv: SessionServer) -> None:
    with srv.a.session(backend=srv.backend) as mine:
        mine.execute("secret = 'acme'")
        other = srv.b.session(session_id=mine.id)
        for attempt in (lambda: other.execute("secret"), other.get, other.close):
            with pytest.raises(NotFound) as nope:
                attempt()
            assert str(nope.value) == f"session_id: no session '{mine.id}'"
        assert [s.session_id for s in srv.b.list_sessions()] == []
        assert mine.id in [s.session_id for s in srv.a.list_sessions()]
        assert mine.execute("secret").value == "'acme'"


def test_bad_input_gets_exact_codes(srv: SessionServer) -> None:
    with pytest.raises(NotFound) as unknown:
        srv.a.session(session_id="s-nope").execute("1")
    assert str(unknown.value) == "session_id: no session 's-nope'"
    with pytest.raises(PermissionDenied) as denied:
        srv.nosess.session(backend=srv.backend).create()
    assert str(denied.value) == "sessions: tenant 'initech' may not open sessions"
    other = "docker" if srv.backend == "process" else "process"
    with srv.a.session(backend=srv.backend) as session:
        # An execution while one runs is refused, not queued; the running one is unharmed.
        results: list[object] = []
        runner = threading.Thread(
            target=lambda: results.append(session.execute("import time\ntime.sleep(1.5)\n'slow'"))
        )
        runner.start()
        deadline = time.monotonic() + 10
        while not session.get().running_execution_id and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(FailedPrecondition) as busy:
            session.execute("1")
        runner.join(20)
        assert "is running execution" in str(busy.value)
        assert str(busy.value).endswith(
            "a session runs one execution at a time (refused, not queued)"
        )
        assert [getattr(r, "value", None) for r in results] == ["'slow'"]
        wanted = pb.BACKEND_DOCKER if other == "docker" else pb.BACKEND_PROCESS
        with grpc.insecure_channel(srv.address) as channel:
            stub = pb_grpc.SandboxServiceStub(channel)
            with pytest.raises(grpc.RpcError) as wrong:
                stub.Execute(
                    pb.ExecuteRequest(script="1", session_id=session.id, backend=wanted),
                    metadata=(("authorization", f"Bearer {KEY_A}"),),
                )
        assert wrong.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert wrong.value.details() == (
            f"backend: session '{session.id}' runs on '{srv.backend}', not '{other}'"
        )
    with pytest.raises(NotFound) as reused:
        session.execute("1")
    assert str(reused.value) == (
        f"session_lost: session '{session.id}' is closed: closed by the client"
    )
    sessions = [srv.a.session(backend=srv.backend) for _ in range(4)]
    try:
        for s in sessions[:3]:
            s.create()
        with pytest.raises(ResourceExhausted) as full:
            sessions[3].create()
        assert str(full.value).startswith("sessions: tenant 'acme' has 3 open sessions")
    finally:
        for s in sessions[:3]:
            s.close()
    srv.assert_healthy()


def test_audit_records_sessions_and_their_executions(srv: SessionServer) -> None:
    with srv.a.session(ECHO, backend=srv.backend, labels={"conv": "c1"}) as session:
        one = session.execute("y = 2")
        two = session.execute("import tools\ntools.lookup(q=y)")
    store = open_store(srv.audit_db)
    try:
        record = store.get("acme", session.id)
        assert record is not None and record.result is not None
        assert record.admission.labels["ptc.kind"] == "session"
        assert record.admission.labels["conv"] == "c1"
        assert record.result.error is not None
        assert record.result.error.message == "closed: closed by the client"
        for execution in (one, two):
            kept = store.get("acme", execution.execution_id)
            assert kept is not None and kept.result is not None
            assert kept.admission.labels["ptc.session_id"] == session.id
            assert kept.result.session_id == session.id
        assert store.get("globex", session.id) is None
        assert store.verify("acme").ok
        listed, _ = store.list("acme", AuditQuery(session_id=session.id))
        assert [r.admission.execution_id for r in listed] == [two.execution_id, one.execution_id]
        page, _ = store.list("acme", AuditQuery(limit=1000))
        assert {session.id, one.execution_id, two.execution_id} <= {
            r.admission.execution_id for r in page
        }
    finally:
        store.close()
    served = srv.a.list_executions(ExecutionQuery(session_id=session.id))
    assert [r.execution_id for r in served.records] == [two.execution_id, one.execution_id]
    assert srv.b.list_executions(ExecutionQuery(session_id=session.id)).records == []
    with pytest.raises(InvalidArgument) as bad:
        srv.a.list_executions(ExecutionQuery(session_id="s-%"))
    assert str(bad.value) == "session_id: 's-%' is not a session id"


def test_a_call_between_executions_is_refused_and_recorded_nowhere(srv: SessionServer) -> None:
    late = (
        "import threading, time, tools\n"
        "seen = []\n"
        "def later():\n"
        "    time.sleep(0.5)\n"
        "    try:\n"
        "        tools.lookup(q=1)\n"
        "    except tools.ToolError as exc:\n"
        "        seen.append(f'{type(exc).__name__}: {exc}')\n"
        "threading.Thread(target=later).start()\n"
    )
    with srv.a.session(ECHO, backend=srv.backend) as session:
        first = session.execute(late)
        time.sleep(1.0)
        second = session.execute("seen")
    assert (first.status, first.calls) == ("ok", [])
    assert (second.status, second.calls) == ("ok", [])
    assert second.value == "['CallRefused: no execution is running in this session']"


def test_async_client_session_and_streamed_cells(srv: SessionServer) -> None:
    async def work() -> tuple[object, object, object]:
        async with (
            AsyncClient(srv.address, KEY_A) as client,
            client.session(backend=srv.backend) as session,
        ):
            first = await session.execute("word = 'hi'")
            # ExecuteStream with the session's id: output streamed, state kept.
            chunks: list[bytes] = []
            streamed = await client.run(
                "print(word * 2)",
                on_output=lambda chunk: chunks.append(chunk.data),
                session_id=session.id,
            )
            return first, streamed, b"".join(chunks)

    first, streamed, chunks = asyncio.run(asyncio.wait_for(work(), 60))
    assert first.status == "ok"  # type: ignore[attr-defined]
    assert (streamed.status, streamed.stdout) == ("ok", "hihi\n")  # type: ignore[attr-defined]
    assert chunks == b"hihi\n"


def test_a_protocol_violation_loses_the_session(srv: SessionServer) -> None:
    forge = (
        "import _ptc_runtime\n_ptc_runtime._channel._sock.sendall(b'\\x00\\x00\\x00\\x05hello')\n"
    )
    with srv.a.session(backend=srv.backend) as session:
        broken = session.execute(forge + "import time\ntime.sleep(5)")
        with pytest.raises(FailedPrecondition) as lost:
            session.execute("1")
    assert broken.status == "limit_exceeded"
    assert tripped(broken) == [("protocol", "killed")]
    assert broken.session_lost.startswith("protocol: frame is not UTF-8 JSON")
    assert str(lost.value) == (
        f"session_lost: session '{session.id}' is lost: cell 1 (execution id "
        f"{broken.execution_id}): {broken.session_lost}"
    )
    srv.assert_healthy()


def test_tenant_ceilings_clamp_idle_timeout_and_lifetime(srv: SessionServer) -> None:
    asked = srv.a.session(backend=srv.backend, idle_timeout=1000, max_lifetime=30)
    default = srv.a.session(backend=srv.backend)
    try:
        clamped, inherited = asked.create(), default.create()
        assert (clamped.idle_timeout_ms, clamped.max_lifetime_ms) == (120_000, 30_000)
        assert (inherited.idle_timeout_ms, inherited.max_lifetime_ms) == (120_000, 600_000)
    finally:
        asked.close()
        default.close()
    ended = {s.session_id: s.state for s in srv.a.list_sessions(include_ended=True)}
    assert ended[asked.id] == ended[default.id] == "closed"
    assert asked.id not in {s.session_id for s in srv.a.list_sessions()}
