"""A refused cell that reached the server not holding its session leaves the session as it was.

Two `ptc serve` on one PostgreSQL schema, with the fleet's global quotas (the tenant's rate held
across both servers, in PostgreSQL). A session is created on the first; its cells go to both
(those reaching the second are carried to the first, which runs them). Once the tenant's rate
is spent fleet-wide, a cell sent to the second server, on every path (unary and streamed, with
and without an idempotency key), is carried to the holder and refused there with the
fleet's RESOURCE_EXHAUSTED, unchanged; the session is untouched, and the cell after the wait,
again through the second server, reads the state the earlier cells built.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.backends.process.cgroups import CgroupManager
from sandbox.client import Client
from sandbox.tenants import hash_key
from tests.ptc_serve import Serving, start_serve, stop_serve

from .refusals import CALLS, Raw, refused, wait_until

pytestmark = pytest.mark.requires_postgres

KEY = "ptc-test-key-refused-fleet-0123456789"
LEASE_TTL_S = 2.0


class Fleet:
    """The two servers (``rf-a``, ``rf-b``) and their processes, stopped by the fixture."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.servers: list[Serving] = []


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[Fleet]:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[[tenant]]\nid = "paced"\nkeys = ["{hash_key(KEY)}"]\nrate_per_minute = 4\n'
    )
    made = Fleet()
    try:
        for instance in ("rf-a", "rf-b"):
            proc, serving = start_serve(
                "--audit-db", pg_url, "--tenants", str(tenants), "--instance-id", instance,
                "--pool-size", "1", "--member-lease-ttl", str(LEASE_TTL_S),
            )  # fmt: skip
            made.procs.append(proc)
            made.servers.append(serving)
        yield made
    finally:
        stderrs = [stop_serve(proc) for proc in made.procs]
        manager = CgroupManager.detect()  # what a killed server left, removed as a restart would
        if manager is not None:
            manager.cleanup_stale()
            manager.close()
    for proc, stderr in zip(made.procs, stderrs, strict=True):
        if proc.returncode != -signal.SIGKILL:
            assert "Traceback" not in stderr, stderr


def test_a_cell_refused_through_the_server_not_holding_the_session(fleet: Fleet) -> None:
    holder, other = (Raw(serving.address, KEY) for serving in fleet.servers)
    try:
        session_id = holder.create()
        outputs = []
        for index, raw in enumerate((holder, other, holder, other)):
            script = "x = 1\nprint(x)" if index == 0 else "x += 1\nprint(x)"
            result = CALLS["unary"](raw, session_id, script)
            assert result.status == pb.EXECUTION_STATUS_OK, result
            outputs.append(result.stdout)
        assert outputs == ["1\n", "2\n", "3\n", "4\n"]
        refusals = {
            name: refused(lambda send=send: send(other, session_id, "x += 100"))  # type: ignore[misc]
            for name, send in CALLS.items()
        }
        for name, (code, message) in refusals.items():
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (name, message)
            assert message.startswith(
                "tenant paced: rate limit of 4 executions per minute reached across the fleet; "
                "retry in "
            ), (name, message)
        info = other.get(session_id)
        assert (info.state, len(info.execution_ids)) == (pb.SESSION_STATE_ACTIVE, 4)
        found = re.search(r"retry in ([0-9.]+) s", refusals["stream-keyed"][1])
        assert found is not None
        time.sleep(float(found.group(1)) + 0.2)
        after = CALLS["stream"](other, session_id, "print(x)")
        assert (after.status, after.stdout) == (pb.EXECUTION_STATUS_OK, "4\n")
        closed = other.close_session(session_id)
        assert (closed.state, len(closed.execution_ids)) == (pb.SESSION_STATE_CLOSED, 5)
    finally:
        holder.close()
        other.close()


def test_a_dead_servers_interrupted_reason_reaches_the_wire(fleet: Fleet) -> None:
    """kill -9 of a server with an execution running: once its lease expired, the survivor
    marks the record `interrupted`, and GetExecution and ListExecutions on the survivor (and
    the SDK's record) say why: the server, its address, and when it was last seen."""
    (a, b), (a_proc, _) = fleet.servers, fleet.procs
    on_a, on_b = Raw(a.address, KEY), Raw(b.address, KEY)
    failed: list[BaseException] = []

    def run_on_a() -> None:
        try:
            on_a.unary(pb.ExecuteRequest(script="import time\ntime.sleep(20)"))
        except grpc.RpcError as exc:  # its server is killed under it
            failed.append(exc)

    caller = threading.Thread(target=run_on_a)
    caller.start()
    try:
        running: list[str] = []

        def listed() -> bool:
            page = on_b.stub.ListExecutions(
                pb.ListExecutionsRequest(running=True), metadata=on_b.metadata, timeout=10
            )
            running[:] = [r.result.execution_id for r in page.records]
            return len(running) == 1

        wait_until("the execution runs on rf-a", listed)
        a_proc.send_signal(signal.SIGKILL)
        a_proc.wait(30)
        caller.join(60)
        [execution_id] = running

        def record() -> pb.ExecutionRecord:
            found: pb.ExecutionRecord = on_b.stub.GetExecution(
                pb.GetExecutionRequest(execution_id=execution_id), metadata=on_b.metadata
            )
            return found

        wait_until(
            "rf-b marks it interrupted",
            lambda: record().result.status == pb.EXECUTION_STATUS_INTERRUPTED,
        )
        got = record()
        page = on_b.stub.ListExecutions(
            pb.ListExecutionsRequest(status=pb.EXECUTION_STATUS_INTERRUPTED),
            metadata=on_b.metadata,
            timeout=10,
        )
        with Client(b.address, KEY) as client:
            sdk = client.get_execution(execution_id)
    finally:
        on_a.close()
        on_b.close()
    assert len(failed) == 1  # the call did not outlive its server
    pattern = (
        rf"the server that held it \(rf-a at {re.escape(a.address)}\) stopped responding at "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
    )
    assert re.fullmatch(pattern, got.interrupted_reason), got.interrupted_reason
    assert [(r.result.execution_id, r.interrupted_reason) for r in page.records] == [
        (execution_id, got.interrupted_reason)
    ]
    assert (sdk.status, sdk.interrupted_reason) == ("interrupted", got.interrupted_reason)
