"""Any server serves any session: two real `ptc serve` processes on one real PostgreSQL store.

A session created through server A is continued through server B with the SDK (cells keep their
state, GetSession, ListSessions fleet-wide, a streamed cell with a client tool, CloseSession):
B carries each call to A, which holds the sandbox, and the records show that A ran the cells.
The holder's errors come back unchanged; a holder killed under a carried call is UNAVAILABLE
naming it. A call that poses as a forwarding server without the fleet's proof is refused with
UNAUTHENTICATED and the server keeps serving; with the fleet's secret (plaintext fleet) or a
fleet certificate (TLS) forwarding works. Skipped, and says so, without PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import psycopg
import pytest

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.client import Client, RetryPolicy
from sandbox.client.tls import TlsFiles
from sandbox.errors import InvalidArgument, NotFound, Unavailable
from sandbox.tenants import hash_key
from tests.postgres_support import fresh_schema
from tests.ptc_serve import PYTHON, ROOT, Serving, ptc_serve
from tests.server.tls_support import Issued, issue, make_ca

pytestmark = pytest.mark.requires_postgres

KEY, OTHER_KEY = "ptc-test-key-forward-0123456789", "ptc-test-key-forward-other-01234"
TENANTS = (
    f'[[tenant]]\nid = "acme"\nkeys = ["{hash_key(KEY)}"]\n'
    f'[[tenant]]\nid = "globex"\nkeys = ["{hash_key(OTHER_KEY)}"]\n'
)
FROZEN_BOUND_S = 30.0  # a frozen holder noticed with 1 s pings: ~2 s idle, generous when loaded
JOIN_WAIT_S = 60.0  # a server's first heartbeat follows its start; waited for, not timed
REFUSED = (
    "ptc-forwarded-by: only a fleet server may carry calls between servers, and this call does "
    "not carry the fleet's secret (ptc-fleet-secret); an API key cannot stand in for it"
)


def sql(url: str, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute(query, params)
        return list(cursor.fetchall()) if cursor.description else []


def wait_for_members(url: str, count: int) -> None:
    deadline = time.monotonic() + JOIN_WAIT_S
    while time.monotonic() < deadline:
        if sql(url, "SELECT COUNT(*) FROM fleet_members") == [(count,)]:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} servers did not join: {sql(url, 'SELECT * FROM fleet_members')}")


@dataclass
class Pair:
    a: Serving
    b: Serving
    url: str


def _common(url: str, tenants: Path) -> tuple[str, ...]:
    return ("--audit-db", url, "--tenants", str(tenants), "--pool-size", "1")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tenants = tmp_path_factory.mktemp("forward") / "tenants.toml"
    tenants.write_text(TENANTS)
    with (
        fresh_schema("ptc_forward") as schema,
        ptc_serve(*_common(schema.url, tenants), "--instance-id", "fwd-a") as a,
        ptc_serve(*_common(schema.url, tenants), "--instance-id", "fwd-b") as b,
    ):
        wait_for_members(schema.url, 2)
        yield Pair(a, b, schema.url)


def double(n: int) -> int:
    """Doubles n, on the client."""
    return 2 * n


def test_a_session_created_on_a_is_served_through_b(pair: Pair) -> None:
    with Client(pair.a.address, KEY) as ca, Client(pair.b.address, KEY) as cb:
        created = ca.session().create()
        through_b = cb.session(session_id=created.session_id)
        first = through_b.execute("x = 20\nprint('set')")
        second = through_b.execute("x += 1\nprint(x)")
        assert (first.stdout, second.stdout) == ("set\n", "21\n")
        assert ca.session(session_id=created.session_id).execute("print(x * 2)").stdout == "42\n"
        info = through_b.get()
        assert (info.state, info.execution_ids[:2]) == (
            "active",
            [first.execution_id, second.execution_id],
        )
        # Fleet-wide: B lists the session A holds, and A lists it too.
        assert created.session_id in {s.session_id for s in cb.list_sessions()}
        assert created.session_id in {s.session_id for s in ca.list_sessions()}
        # ExecuteStream through B, both ways: output out, a client tool's call and answer.
        chunks: list[bytes] = []
        streamed = cb.run(
            "import tools\nprint(tools.double(n=x))",
            tools=[double],
            session_id=created.session_id,
            on_output=lambda chunk: chunks.append(chunk.data),
        )
        assert (streamed.status, streamed.stdout, b"".join(chunks)) == ("ok", "42\n", b"42\n")
        assert [(c.tool, c.result) for c in streamed.calls] == [("double", 42)]
        closed = through_b.close()
        assert (closed.state, closed.end_reason) == ("closed", "closed by the client")
        assert ca.session(session_id=created.session_id).get().state == "closed"
        # Ended, the session is no one's: B answers from the record, as any server would.
        with pytest.raises(NotFound) as gone:
            through_b.execute("print(x)")
    assert str(gone.value) == (
        f"session_lost: session '{created.session_id}' is gone: closed: closed by the client"
    )
    ran = {e.execution_id for e in (first, second, streamed)}
    rows = sql(pair.url, "SELECT DISTINCT instance FROM executions WHERE execution_id = ANY(%s)",
               (list(ran),))  # fmt: skip
    assert rows == [("fwd-a",)]  # every cell ran on the holder


def test_the_holders_errors_come_back_unchanged(pair: Pair) -> None:
    with Client(pair.a.address, KEY) as ca, Client(pair.b.address, KEY) as cb:
        sid = ca.session().create().session_id
        try:
            messages = []
            for client in (ca, cb):
                with pytest.raises(InvalidArgument) as caught:
                    client.session(session_id=sid).execute("1", runtime="nope")
                messages.append(str(caught.value))
            assert (
                messages[0]
                == messages[1]
                == (
                    f"runtime: session '{sid}' runs in the standard library, not 'nope'; a "
                    "session's runtime is chosen at CreateSession"
                )
            )
            # Another tenant's key through B finds nothing, as through A.
            with Client(pair.b.address, OTHER_KEY) as other, pytest.raises(NotFound) as foreign:
                other.session(session_id=sid).get()
            assert str(foreign.value) == f"session_id: no session '{sid}'"
        finally:
            ca.session(session_id=sid).close()


def _posing(address: str, secret: str | None) -> pb.ExecutionResult:
    metadata = [("authorization", f"Bearer {KEY}"), ("ptc-forwarded-by", "10.0.0.9:50051")]
    if secret is not None:
        metadata.append(("ptc-fleet-secret", secret))
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SandboxServiceStub(channel)
        reply: pb.ExecutionResult = stub.Execute(
            pb.ExecuteRequest(script="print(6 * 7)"), metadata=metadata, timeout=60
        )
        return reply


@pytest.mark.parametrize(
    "secret", [None, "", "not-the-fleet-secret"], ids=["none", "empty", "wrong"]
)
def test_posing_as_a_forwarder_is_refused(pair: Pair, secret: str | None) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _posing(pair.b.address, secret)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert caught.value.details() == REFUSED
    with Client(pair.b.address, KEY) as client:  # still serving
        assert client.run("print(1)").stdout == "1\n"


def test_the_fleet_secret_is_shared_through_the_store(pair: Pair) -> None:
    [(secret,)] = sql(pair.url, "SELECT secret FROM fleet_secret")
    assert isinstance(secret, str) and len(secret) >= 40
    assert _posing(pair.b.address, secret).stdout == "42\n"


# -- a holder that dies under a carried call ---------------------------------------------------


@contextlib.contextmanager
def _killable(
    url: str, tenants: Path, instance: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [PYTHON, "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", *_common(url, tenants),
         "--instance-id", instance, "--member-lease-ttl", "120"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield proc, line.split()[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_a_holder_killed_mid_call_is_unavailable_naming_it(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    with (
        fresh_schema("ptc_forward_kill") as schema,
        _killable(schema.url, tenants, "fwd-doomed") as (doomed, doomed_address),
        ptc_serve(*_common(schema.url, tenants), "--instance-id", "fwd-survivor") as survivor,
    ):
        wait_for_members(schema.url, 2)
        with Client(doomed_address, KEY) as cd, Client(survivor.address, KEY) as cs:
            sid = cd.session().create().session_id
            cell, outcome = _long_cell(cs, sid)
            _wait_running_cell(schema.url, sid)
            doomed.kill()
            cell.join(120)
            assert len(outcome) == 1 and isinstance(outcome[0], Unavailable), outcome
            assert str(outcome[0]).startswith(
                f"session_id: the server holding the session (fwd-doomed at '{doomed_address}') "
                "cannot be reached: "
            )
            # Its lease still runs: GetSession is carried and fails the same way; ListSessions
            # leaves the silent server out (and logs it) rather than failing.
            with pytest.raises(Unavailable) as again:
                cs.session(session_id=sid).get()
            assert str(again.value).startswith(
                f"session_id: the server holding the session (fwd-doomed at '{doomed_address}') "
            )
            assert cs.list_sessions() == []
            assert cs.run("print('still ok')").stdout == "still ok\n"


def test_a_frozen_holder_is_unavailable_naming_it_and_its_silence(tmp_path: Path) -> None:
    """A holder frozen with SIGSTOP (its socket open, nothing answered) under a carried cell:
    the carrier's keepalive pings to it go unanswered, and the cell ends UNAVAILABLE naming the
    holder and why, in bounded time, where it waited for ever before."""
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    quick = ("--keepalive-interval", "1", "--keepalive-timeout", "1")
    with (
        fresh_schema("ptc_forward_frozen") as schema,
        ptc_serve(*_common(schema.url, tenants), "--instance-id", "fwd-doomed", *quick) as held,
        ptc_serve(*_common(schema.url, tenants), "--instance-id", "fwd-carrier", *quick) as carrier,
        Client(held.address, KEY) as ch,
        Client(carrier.address, KEY) as cc,
    ):
        wait_for_members(schema.url, 2)
        cc.retry = RetryPolicy(attempts=1)  # one carried attempt: its own error is the answer
        sid = ch.session().create().session_id
        cell, outcome = _long_cell(cc, sid)
        try:
            _wait_running_cell(schema.url, sid)
            os.kill(held.pid, signal.SIGSTOP)
            started = time.monotonic()
            cell.join(FROZEN_BOUND_S)
            took = time.monotonic() - started
        finally:
            os.kill(held.pid, signal.SIGCONT)
        cell.join()
        assert len(outcome) == 1 and isinstance(outcome[0], Unavailable), outcome
        message = str(outcome[0])
        assert message.startswith(
            f"session_id: the server holding the session (fwd-doomed at '{held.address}') "
            "cannot be reached: "
        ), message
        assert message.endswith("(it stopped answering keepalive pings)"), message
        assert took < FROZEN_BOUND_S
        assert cc.run("print('still ok')").stdout == "still ok\n"


def _long_cell(client: Client, sid: str) -> tuple[threading.Thread, list[BaseException]]:
    """A minute-long cell of session ``sid`` through ``client``, on a thread of its own, and
    the list its error goes to."""
    outcome: list[BaseException] = []

    def long_cell() -> None:
        try:
            client.session(session_id=sid).execute("import time\ntime.sleep(60)")
        except BaseException as exc:
            outcome.append(exc)

    cell = threading.Thread(target=long_cell)
    cell.start()
    return cell, outcome


def _wait_running_cell(url: str, sid: str) -> None:
    deadline = time.monotonic() + JOIN_WAIT_S
    while time.monotonic() < deadline:
        rows = sql(url, "SELECT COUNT(*) FROM executions WHERE status = 'running' AND "
                   "execution_id <> %s AND instance = 'fwd-doomed'", (sid,))  # fmt: skip
        if rows == [(1,)]:
            return
        time.sleep(0.05)
    raise AssertionError("the cell carried to the holder never started")


# -- a TLS fleet: servers prove themselves with fleet certificates -----------------------------


def test_forwarding_under_tls_with_fleet_certificates(tmp_path: Path) -> None:
    ca, clients_ca, fleet_ca = (make_ca(tmp_path, n) for n in ("srv-ca", "clients-ca", "fleet-ca"))
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    client_cert = issue(clients_ca, tmp_path, "client", server=False)

    def tls_args(name: str) -> tuple[str, ...]:
        own: Issued = issue(ca, tmp_path, f"server-{name}", server=True)
        fleet: Issued = issue(fleet_ca, tmp_path, f"fleet-{name}", server=False)
        return ("--tls-cert", str(own.cert), "--tls-key", str(own.key),
                "--tls-client-ca", str(clients_ca.cert), "--fleet-ca", str(fleet_ca.cert),
                "--fleet-cert", str(fleet.cert), "--fleet-key", str(fleet.key),
                "--fleet-peer-ca", str(ca.cert), "--instance-id", f"tls-{name}")  # fmt: skip

    pair: TlsFiles = {
        "tls_ca": str(ca.cert),
        "tls_cert": str(client_cert.cert),
        "tls_key": str(client_cert.key),
    }
    with (
        fresh_schema("ptc_forward_tls") as schema,
        ptc_serve(*_common(schema.url, tenants), *tls_args("a")) as a,
        ptc_serve(*_common(schema.url, tenants), *tls_args("b")) as b,
    ):
        wait_for_members(schema.url, 2)
        with Client(a.address, KEY, **pair) as ca_client, Client(b.address, KEY, **pair) as cb:
            sid = ca_client.session().create().session_id
            through_b = cb.session(session_id=sid)
            assert through_b.execute("y = 7").status == "ok"
            assert through_b.execute("print(y * 6)").stdout == "42\n"
            assert sid in {s.session_id for s in cb.list_sessions()}
            assert through_b.close().state == "closed"
        # The fleet's secret is no proof where the fleet has a CA.
        assert sql(schema.url, "SELECT COUNT(*) FROM fleet_secret") == [(0,)]


def test_a_carried_call_is_never_carried_again(pair: Pair) -> None:
    """A call that arrives carried is answered where it lands, even for a session held
    elsewhere: two servers that disagree about a holder cannot bounce it between them."""
    [(secret,)] = sql(pair.url, "SELECT secret FROM fleet_secret")
    with Client(pair.a.address, KEY) as ca:
        sid = ca.session().create().session_id
        try:
            metadata = (("authorization", f"Bearer {KEY}"), ("ptc-forwarded-by", "10.0.0.9:1"),
                        ("ptc-fleet-secret", str(secret)))  # fmt: skip
            with grpc.insecure_channel(pair.b.address) as channel:
                stub = pb_grpc.SandboxServiceStub(channel)
                with pytest.raises(grpc.RpcError) as caught:
                    stub.GetSession(pb.GetSessionRequest(session_id=sid), metadata=metadata,
                                    timeout=60)  # fmt: skip
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert caught.value.details() == (
                f"session_lost: session '{sid}' is gone: running: the server that held it "
                "stopped before ending it"
            )
            trailing = caught.value.trailing_metadata()
            assert ("ptc-holder-answer", "1") in [(m.key, str(m.value)) for m in trailing]
        finally:
            ca.session(session_id=sid).close()
