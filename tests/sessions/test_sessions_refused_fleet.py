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
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox.tenants import hash_key
from tests.ptc_serve import Serving, start_serve, stop_serve

from .refusals import CALLS, Raw, refused

pytestmark = pytest.mark.requires_postgres

KEY = "ptc-test-key-refused-fleet-0123456789"


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[tuple[Serving, Serving]]:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(
        f'[[tenant]]\nid = "paced"\nkeys = ["{hash_key(KEY)}"]\nrate_per_minute = 4\n'
    )
    procs: list[subprocess.Popen[str]] = []
    servers = []
    try:
        for instance in ("rf-a", "rf-b"):
            proc, serving = start_serve(
                "--audit-db", pg_url, "--tenants", str(tenants), "--instance-id", instance,
                "--pool-size", "1",
            )  # fmt: skip
            procs.append(proc)
            servers.append(serving)
        yield servers[0], servers[1]
    finally:
        stderrs = [stop_serve(proc) for proc in procs]
    for stderr in stderrs:
        assert "Traceback" not in stderr, stderr


def test_a_cell_refused_through_the_server_not_holding_the_session(
    fleet: tuple[Serving, Serving],
) -> None:
    holder, other = (Raw(serving.address, KEY) for serving in fleet)
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
