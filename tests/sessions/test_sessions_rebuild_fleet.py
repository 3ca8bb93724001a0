"""Sessions survive their server: two real `ptc serve` on one real PostgreSQL database.

A session built on server A (variables, a file in its /tmp, a call of a host tool that counts
its own runs in a file) continues on server B after A is killed with SIGKILL (once A's fleet
lease expired) or stopped with SIGTERM (it hands its sessions over): B rebuilds it by replaying
its cells, answering the tool call from the record, so the tool ran once in all. Sessions that
cannot be rebuilt are `lost`, naming why: a cell that prints a random number (the first cell
that differs), more cells than the tenant's ``session_rebuild_max_cells``, and more CPU than
its ``session_rebuild_max_cpu_s``. The chain verifies afterwards. Skipped, and says so,
without ``PTC_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sandbox.backends.process.cgroups import CgroupManager
from sandbox.client import Client
from sandbox.errors import FailedPrecondition, NotFound
from sandbox.tenants import hash_key
from tests.ptc_serve import PYTHON, ROOT, stop_serve

LEASE_TTL_S = 2.0
KEYS = {t: f"ptc-test-key-rebuild-{t}-0123456789" for t in ("acme", "tight", "cpu")}
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(KEYS["acme"])}"]
backends = ["process"]

[[tenant]]
id = "tight"
keys = ["{hash_key(KEYS["tight"])}"]
backends = ["process"]
session_rebuild_max_cells = 2

[[tenant]]
id = "cpu"
keys = ["{hash_key(KEYS["cpu"])}"]
backends = ["process"]
session_rebuild_max_cpu_s = 1
"""
TALLY = [
    {
        "name": "tally",
        "description": "Counts its runs.",
        "parameters": {
            "type": "object",
            "properties": {"note": {"type": "string"}},
            "required": ["note"],
        },
        "x-ptc": {"mode": "host"},
    }
]
CELLS = (
    "x = 41\nx",
    "open('/tmp/state.txt', 'w').write('kept')\nprint('wrote')",
    "import tools\nn = tools.tally(note='once')\nprint('tally', n)",
)

pytestmark = pytest.mark.requires_postgres


class Fleet:
    """Servers started by a test, on one schema; each stopped (or killed) by the test."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tenants = tmp / "tenants.toml"
        self.tenants.write_text(TENANTS)
        self.tally = tmp / "tally.txt"
        self.procs: list[subprocess.Popen[str]] = []
        self.metrics = ""  # the /metrics address of the server started with --metrics-listen

    def start(self, instance: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
        env = {
            **os.environ,
            "PTC_TEST_TALLY": str(self.tally),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)]),
        }
        proc = subprocess.Popen(
            [PYTHON, "-m", "sandbox.cli", "serve", "--listen", "127.0.0.1:0", "--pool-size", "1",
             "--audit-db", self.url, "--tenants", str(self.tenants), "--instance-id", instance,
             "--member-lease-ttl", str(LEASE_TTL_S), "--host-handler",
             "tally=ptc_rebuild_host_tools:tally", *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if line.startswith("metrics on "):
            self.metrics = line.split()[-1]
            line = proc.stdout.readline()
        assert line.startswith("listening on "), line + proc.stderr.read()
        return proc, line.split()[-1]

    def sql(self, query: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn, conn.cursor() as cursor:
            cursor.execute(query, params)
            return list(cursor.fetchall()) if cursor.description else []

    def wait_lease_expired(self, instance: str) -> None:
        deadline = time.monotonic() + LEASE_TTL_S + 30
        while self.sql(
            "SELECT 1 FROM fleet_members WHERE instance = %s AND expires_at_us >= %s",
            (instance, time.time_ns() // 1000),
        ):
            assert time.monotonic() < deadline, f"{instance}'s lease never expired"
            time.sleep(0.1)

    def runs_of_tally(self) -> int:
        return len(self.tally.read_text().splitlines()) if self.tally.exists() else 0

    def verify(self) -> None:
        done = subprocess.run(
            [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", self.url],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(pg_url, tmp_path)
    try:
        yield made
    finally:
        stderrs = [stop_serve(proc, 60) for proc in made.procs]
        manager = CgroupManager.detect()  # what a killed server left, removed as a restart would
        if manager is not None:
            manager.cleanup_stale()
            manager.close()
    for stderr in stderrs:  # every server, the survivors and the rebuilders, stopped cleanly
        assert "Traceback" not in stderr, stderr


def _build(client: Client, tenant_cells: tuple[str, ...]) -> tuple[str, list[str]]:
    session = client.session(TALLY)
    session.create()
    ids = []
    for script in tenant_cells:
        done = session.execute(script)
        assert done.status == "ok", done
        ids.append(done.execution_id)
    return session.id, ids


def _lost(client: Client, session_id: str) -> str:
    with pytest.raises(FailedPrecondition) as lost:
        client.run("print('next')", session_id=session_id)
    return str(lost.value)


def test_after_kill_9_the_next_cell_runs_on_the_survivor_with_the_state_rebuilt(
    fleet: Fleet,
) -> None:
    a, a_address = fleet.start("rb-a")
    _b, b_address = fleet.start("rb-b", "--metrics-listen", "127.0.0.1:0")
    with (
        Client(a_address, api_key=KEYS["acme"]) as on_a,
        Client(a_address, api_key=KEYS["tight"]) as tight_a,
        Client(a_address, api_key=KEYS["cpu"]) as cpu_a,
    ):
        kept, kept_ids = _build(on_a, CELLS)
        assert fleet.runs_of_tally() == 1
        random_cells = ("y = 1", "import random\nprint(random.random())", "y")
        chancy, chancy_ids = _build(on_a, random_cells)
        recorded_random = on_a.get_execution(chancy_ids[1]).result
        assert recorded_random is not None
        too_long, _ = _build(tight_a, ("a = 1", "b = 2", "c = 3"))
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5:\n  pass"
        costly, costly_ids = _build(cpu_a, (burn,))
    a.send_signal(signal.SIGKILL)
    a.wait(timeout=30)
    fleet.wait_lease_expired("rb-a")

    with Client(b_address, api_key=KEYS["acme"]) as on_b:
        done = on_b.run(
            "print(x + 1, open('/tmp/state.txt').read(), n)", session_id=kept, tools=TALLY
        )
        assert (done.status, done.stdout, done.session_id) == ("ok", "42 kept 1\n", kept)
        info = on_b.session(session_id=kept).get()
        assert list(info.execution_ids) == [*kept_ids, done.execution_id]
        again = on_b.run("x", session_id=kept)  # now held by B: a plain next cell
        assert again.value == "41"
        message = _lost(on_b, chancy)
    # The tool ran once in all: the rebuild answered it from the record.
    assert fleet.runs_of_tally() == 1
    assert fleet.sql("SELECT COUNT(*) FROM calls WHERE tool = 'tally'") == [(1,)]
    taken = fleet.sql(
        "SELECT payload FROM entries WHERE kind = 'taken_over' AND execution_id = %s", (kept,)
    )
    moves = [_json(p) for (p,) in taken]
    assert [(m["from"], m["instance"]) for m in moves] == [("rb-a", "rb-b")]
    assert fleet.sql(
        "SELECT instance, status FROM executions WHERE execution_id = %s", (kept,)
    ) == [("rb-b", "running")]

    recorded_line = recorded_random.stdout.splitlines()[0]
    prefix = (
        f"session_lost: session {chancy!r} is lost: could not be rebuilt on rb-b: cell 2 "
        f"(execution id {chancy_ids[1]}) printed different output: stdout differs: line 1 was "
        f"{recorded_line!r}, is "
    )
    assert message.startswith(prefix), message
    with Client(b_address, api_key=KEYS["tight"]) as tight_b:
        assert _lost(tight_b, too_long) == (
            f"session_lost: session {too_long!r} is lost: could not be rebuilt on rb-b: "
            "session_rebuild_max_cells: it has more recorded cells than the tenant's bound of 2 "
            "cells a rebuild may replay"
        )
    with Client(b_address, api_key=KEYS["cpu"]) as cpu_b:
        spent = _lost(cpu_b, costly)
    assert re.fullmatch(
        re.escape(
            f"session_lost: session {costly!r} is lost: could not be rebuilt on rb-b: "
            f"session_rebuild_max_cpu_s: replaying cell 1 (execution id {costly_ids[0]}) reached "
            "the tenant's bound of 1 CPU seconds for a rebuild ("
        )
        + r"\d+\.\d\d s spent\)",
        spent,
    ), spent
    scraped = urllib.request.urlopen(f"http://{fleet.metrics}/metrics", timeout=10).read()
    counts = dict(
        re.findall(r'^ptc_session_rebuilds_total\{outcome="(\w+)"\} (\S+)$', scraped.decode(), re.M)
    )
    assert counts == {"rebuilt": "1.0", "lost": "3.0"}, counts
    # The lost ones are ended in the record with the reason: every server says the same.
    for session_id in (chancy, too_long, costly):
        rows = fleet.sql("SELECT status FROM executions WHERE execution_id = %s", (session_id,))
        assert rows and rows[0][0] in ("failed", "limit_exceeded"), rows
    fleet.verify()


def test_sigterm_hands_the_session_to_the_next_server_with_nothing_lost(fleet: Fleet) -> None:
    a, a_address = fleet.start("rb-a")
    _b, b_address = fleet.start("rb-b")
    with Client(a_address, api_key=KEYS["acme"]) as on_a:
        kept, kept_ids = _build(on_a, CELLS)
    stderr = stop_serve(a, 60)
    assert a.returncode == 0, stderr
    record = fleet.sql("SELECT status FROM executions WHERE execution_id = %s", (kept,))
    assert record == [("interrupted",)]  # handed over: open, not ended
    with Client(b_address, api_key=KEYS["acme"]) as on_b, pytest.raises(NotFound) as asked:
        on_b.session(session_id=kept).get()  # GetSession does not rebuild; it says what will
    assert str(asked.value) == (
        f"session_lost: session {kept!r} is gone: interrupted: handed over: the server that held "
        "it was draining; its next execution rebuilds it from its record"
    )
    with Client(b_address, api_key=KEYS["acme"]) as on_b:
        done = on_b.run("print(x + 1, open('/tmp/state.txt').read(), n)", session_id=kept)
        assert (done.status, done.stdout) == ("ok", "42 kept 1\n")
        info = on_b.session(session_id=kept).get()
        assert list(info.execution_ids) == [*kept_ids, done.execution_id]
    assert fleet.runs_of_tally() == 1
    reasons = fleet.sql(
        "SELECT payload FROM entries WHERE kind = 'interrupted' AND execution_id = %s", (kept,)
    )
    assert [_json(p)["handed_over"] for (p,) in reasons] == [True]
    fleet.verify()


def _json(value: object) -> dict[str, object]:
    data = json.loads(value) if isinstance(value, str) else value
    assert isinstance(data, dict)
    return data
