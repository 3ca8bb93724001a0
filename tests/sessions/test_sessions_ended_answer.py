"""Ended sessions answer: GetSession of a closed or expired session gives its final state and
reason from the store's session row, after its server restarted (SQLite) and from another server
of the fleet (PostgreSQL), through real `ptc serve` processes; a session that never existed is
still NOT_FOUND, and the servers keep serving."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandbox.client import Client
from sandbox.errors import NotFound
from tests.ptc_serve import ptc_serve


def _closed_with_cells(client: Client) -> tuple[str, list[str]]:
    session = client.session()
    session.create()
    ids = [session.execute(f"x = {i}\nprint(x)").execution_id for i in range(2)]
    session.close()
    return session.id, ids


def _expired(client: Client) -> str:
    session = client.session(idle_timeout=0.5)
    session.create()
    session.execute("y = 1")
    deadline = time.monotonic() + 20
    while session.get().state == "active":
        assert time.monotonic() < deadline, "the idle session never expired"
        time.sleep(0.1)
    return session.id


def _check_ended(client: Client, closed: str, cells: list[str], expired: str) -> None:
    info = client.session(session_id=closed).get()
    assert (str(info.state), info.end_reason) == ("closed", "closed by the client")
    assert info.execution_ids == cells
    assert info.ended_at is not None and info.ended_at >= info.created_at
    assert info.backend == "process"
    gone = client.session(session_id=expired).get()
    assert str(gone.state) == "expired"
    assert gone.end_reason.startswith("idle: no execution for "), gone.end_reason
    with pytest.raises(NotFound, match="no session 's-0123456789abcdef'"):
        client.session(session_id="s-0123456789abcdef").get()
    assert client.run("print(6 * 7)").stdout == "42\n"  # still serving


def test_ended_sessions_answer_after_a_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "audit.db")
    with ptc_serve("--pool-size", "1", "--audit-db", db) as first, Client(first.address) as c:
        closed, cells = _closed_with_cells(c)
        expired = _expired(c)
    with ptc_serve("--pool-size", "1", "--audit-db", db) as again, Client(again.address) as c:
        _check_ended(c, closed, cells, expired)


@pytest.mark.requires_postgres
def test_ended_sessions_answer_from_another_server_of_the_fleet(pg_url: str) -> None:
    common = ("--pool-size", "1", "--audit-db", pg_url)
    with (
        ptc_serve(*common, "--instance-id", "end-a") as a,
        ptc_serve(*common, "--instance-id", "end-b") as b,
        Client(a.address) as on_a,
        Client(b.address) as on_b,
    ):
        closed, cells = _closed_with_cells(on_a)
        expired = _expired(on_a)
        _check_ended(on_b, closed, cells, expired)
