"""A cell refused while the audit store is down never ends its session.

A real `ptc serve` on a PostgreSQL cluster of the test's own (`scripts/postgres.sh` in a private
directory: the test stops that server and starts it again, which it must never do to a cluster
other tests share). While PostgreSQL is stopped, every cell of the session (unary and streamed,
with and without an idempotency key) is refused with UNAVAILABLE naming the store's error, and
none is admitted; once PostgreSQL is back and the server ready again, the next cell reads the
variable the first cell set. `requires_postgres`: it runs where PostgreSQL is installed and
provided to the tests (CI's scripts/test.sh), and skips, saying so, elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox._proto import sandbox_pb2 as pb
from sandbox.server.fleet import READINESS_SERVICE
from sandbox.tenants import hash_key
from tests.postgres_support import PrivateCluster, private_cluster
from tests.ptc_serve import ptc_serve

from .refusals import CALLS, Raw, refused, wait_until

pytestmark = pytest.mark.requires_postgres

KEY = "ptc-test-key-store-restart-0123456789"


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as made:
        yield made


def _ready(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=10
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# Which check meets the stopped store first: with global quotas, the tenant's admission (in
# PostgreSQL); without, the audit record's admission. A cell with a key meets the look-up of
# its key before either.
FIRST_CHECK = {
    "global-quotas": "global quotas: PostgreSQL failed: ",
    "per-instance-quotas": "execution not admitted: audit store: ",
}
KEYED = "execution not admitted: audit store: "


@pytest.mark.parametrize("quotas", sorted(FIRST_CHECK))
def test_a_cell_refused_while_postgres_restarts_leaves_the_session_as_it_was(
    cluster: PrivateCluster, tmp_path: Path, quotas: str
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'[[tenant]]\nid = "acme"\nkeys = ["{hash_key(KEY)}"]\n')
    config = tmp_path / "server.toml"
    config.write_text(f"global_quotas = {str(quotas == 'global-quotas').lower()}\n")
    with ptc_serve(
        "--config", str(config), "--audit-db", cluster.url, "--tenants", str(tenants),
        "--pool-size", "1",
    ) as server:  # fmt: skip
        raw = Raw(server.address, KEY)
        try:
            wait_until("the server is ready", lambda: _ready(server.address))
            session_id = raw.create()
            first = CALLS["unary"](raw, session_id, "x = 'before'\nprint(x)")
            assert (first.status, first.stdout) == (pb.EXECUTION_STATUS_OK, "before\n")
            cluster.halt()
            refusals = {
                name: refused(lambda send=send: send(raw, session_id, "x = 'lost'"))  # type: ignore[misc]
                for name, send in CALLS.items()
            }
            cluster.start()
            wait_until("the server is ready again", lambda: _ready(server.address))
            after = CALLS["stream"](raw, session_id, "print(x)")
            info = raw.close_session(session_id)
        finally:
            raw.close()
    for name, (code, message) in refusals.items():
        assert code == grpc.StatusCode.UNAVAILABLE, (name, message)
        cause = KEYED if name.endswith("keyed") else FIRST_CHECK[quotas]
        assert message.startswith(cause), (name, message)
        # The store's own error follows: the connection it lost, or the one it cannot open.
        assert "PostgreSQL" in message and ("connection" in message), (name, message)
    assert (after.status, after.stdout) == (pb.EXECUTION_STATUS_OK, "before\n")
    assert (info.state, info.end_reason) == (pb.SESSION_STATE_CLOSED, "closed by the client")
    assert list(info.execution_ids) == [first.execution_id, after.execution_id]
