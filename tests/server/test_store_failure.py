"""A server whose audit store refuses writes leaves the rotation, and comes back by itself.

Against a real `ptc serve` under load:
- SQLite on a small tmpfs the test mounts, filled by a file the test writes until the kernel
  says ENOSPC: new executions get UNAVAILABLE naming SQLite's error ("database or disk is
  full", never "cannot rollback", never INTERNAL), readiness turns NOT_SERVING, an execution that
  was in flight when the disk filled returns its result and its completion waits in memory
  (``ptc_audit_completions_pending``); once the filler is deleted, readiness is SERVING again,
  the waiting completion is written, no record is left `running`, and `ptc audit verify` passes.
- PostgreSQL refusing writes: a fresh database set ``default_transaction_read_only`` and its
  connections ended (as a failover to a read-only replica does), then set writable again.
Mounting needs root (it skips and says so without); the PostgreSQL case is `requires_postgres`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.client import Client, tool
from sandbox.errors import PtcError, Unavailable
from sandbox.result import ExecutionResult
from sandbox.server.fleet import READINESS_SERVICE
from tests.postgres_support import POSTGRES_URL
from tests.ptc_serve import PYTHON, ROOT, ptc_serve
from tests.small_fs import fill, small_tmpfs

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
BIG_OUTPUT = 200_000  # the in-flight execution's output: far more than a full disk has left
LOAD_THREADS = 3
WAIT_S = 60.0  # a bound on waiting for a state, never a measured time


def _readiness(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=READINESS_SERVICE), timeout=10
        )
    return int(reply.status)


def _wait_until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def _metric(metrics_address: str | None, name: str) -> float:
    """The sample ``name``, summed over its labels."""
    assert metrics_address is not None
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    samples = [line for line in lines if line.startswith((f"{name} ", f"{name}{{"))]
    assert samples, f"{name} is not among the metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


class _Load:
    """Threads executing small scripts in a loop; every outcome is kept, in order."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.outcomes: list[tuple[float, str, str]] = []  # (when, "ok" | error class, message)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,)) for i in range(LOAD_THREADS)
        ]

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WAIT_S)

    def _loop(self, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                result = self.client.execute(f"print({worker}, {n})")
                outcome = (
                    ("ok", "") if result.stdout == f"{worker} {n}\n" else ("bad", repr(result))
                )
            except PtcError as exc:
                outcome = (type(exc).__name__, exc.message)
            with self._lock:
                self.outcomes.append((time.monotonic(), *outcome))
            self._stop.wait(0.05)

    def seen(self, kind: str, since: float = 0.0) -> int:
        with self._lock:
            return sum(1 for at, k, _ in self.outcomes if k == kind and at >= since)


def _gated_execution(
    client: Client, pool: ThreadPoolExecutor
) -> tuple[threading.Event, threading.Event, Future[ExecutionResult]]:
    """An execution that runs (admitted, recorded `running`) until the test releases it, then
    prints `BIG_OUTPUT` bytes: its completion is written after whatever the test did meanwhile."""
    entered, release = threading.Event(), threading.Event()

    @tool
    def gate() -> str:
        """Holds the script until the test says go."""
        entered.set()
        release.wait(WAIT_S)
        return "go"

    script = f"import tools\nassert tools.gate() == 'go'\nprint('x' * {BIG_OUTPUT})"
    future = pool.submit(client.run, script, [gate], limits={"wall_time_ms": 120_000})
    if not entered.wait(WAIT_S):
        raise AssertionError(f"the gated execution never reached its tool call: {future}")
    return entered, release, future


def _store_errors(load: _Load) -> list[tuple[str, str]]:
    return [(kind, message) for _, kind, message in load.outcomes if kind not in ("ok",)]


def test_a_full_disk_takes_the_server_out_of_rotation_until_space_is_freed(
    tmp_path: Path,
) -> None:
    # 16 MiB, not less: nothing is checkpointed in a test this short, so every transaction's
    # pages pile up in the WAL (about 40 KB per execution, a few MB per second under the load),
    # and on a 2 MiB tmpfs the room the filler's deletion gave back was full again within a
    # second of the load being served: the next completion was kept for good (the WAL held
    # 2 MB, the database file 4 KB) and the gauge read 1 (CI, twice).
    with small_tmpfs(tmp_path / "store", "16m") as fs:
        db = fs / "audit.db"
        with (
            ptc_serve(
                "--audit-db", str(db), "--pool-size", "2", "--instance-id", "full-disk",
                "--metrics-listen", "127.0.0.1:0",
            ) as served,
            Client(served.address) as client,
            ThreadPoolExecutor(1) as pool,
        ):  # fmt: skip
            _wait_until("ready", lambda: _readiness(served.address) == SERVING)
            assert client.execute("print('before')").stdout == "before\n"
            _entered, release, gated = _gated_execution(client, pool)
            with _Load(client) as load:
                _wait_until("the load runs", lambda: load.seen("ok") >= LOAD_THREADS)
                filler = fill(fs)
                full_at = time.monotonic()
                release.set()
                result = gated.result(WAIT_S)
                # The script ran: its caller gets its result although the store refused it.
                assert (result.status, len(result.stdout)) == ("ok", BIG_OUTPUT + 1), result
                _wait_until("not ready", lambda: _readiness(served.address) == NOT_SERVING)
                assert _metric(served.metrics_address, "ptc_audit_completions_pending") >= 1
                _wait_until("refusals", lambda: load.seen("Unavailable", full_at) >= 5)
                with pytest.raises(Unavailable) as refused:
                    client.execute("print('refused')")
                assert refused.value.message.startswith("execution not admitted: ")
                assert "database or disk is full" in refused.value.message
                assert _metric(served.metrics_address, "ptc_audit_write_failures_total") >= 1

                filler.unlink()
                freed_at = time.monotonic()
                _wait_until("ready again", lambda: _readiness(served.address) == SERVING)
                _wait_until("served again", lambda: load.seen("ok", freed_at) >= 5)
            # Written by the readiness check's next `recover` (every second while one waits): a
            # load execution still finishing as the load stopped may have had its completion
            # kept a moment before; the final SELECT below checks every record ended `ok`, none
            # left `running`. If it never reaches 0, the message shows the load's outcomes since
            # the disk was freed.
            _wait_until(
                "no completion waits: "
                + repr([o for o in load.outcomes if o[0] >= freed_at and o[1] != "ok"][:20]),
                lambda: _metric(served.metrics_address, "ptc_audit_completions_pending") == 0,
            )
            assert _metric(served.metrics_address, "ptc_audit_completions_dropped_total") == 0
            errors = _store_errors(load)
            assert errors, "the load saw no refusal"
            for kind, message in errors:  # every failure says what failed, none is INTERNAL
                assert kind == "Unavailable", (kind, message)
                assert message.startswith("execution not admitted: "), message
                assert "database or disk is full" in message, message
            # Nothing runs now: not one record is left `running`, the in-flight one completed.
            with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                statuses: dict[str, int] = dict(
                    conn.execute("SELECT status, COUNT(*) FROM executions GROUP BY 1")
                )
                gated_status = conn.execute(
                    "SELECT status FROM executions WHERE execution_id = ?", (result.execution_id,)
                ).fetchall()
            assert "running" not in statuses, statuses
            assert statuses["ok"] == 2 + load.seen("ok"), statuses
            assert gated_status == [("ok",)]
        assert "database or disk is full" in served.stderr
        assert "cannot rollback" not in served.stderr, served.stderr
        verify = subprocess.run(
            [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", str(db)],
            capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
        )  # fmt: skip
        assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.fixture
def fresh_pg_database() -> Iterator[tuple[str, Callable[[str], None]]]:
    """A database of its own on the shared cluster (the test changes database-wide settings):
    its URL, and a function that runs SQL from another database and then ends every connection
    to it, as a failover would, so that the server's connections see the change."""
    import psycopg

    name = f"ptc_refuse_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = urlunparse(urlparse(POSTGRES_URL)._replace(path=f"/{name}"))

    def alter(sql: str) -> None:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(sql)
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )

    try:
        yield url, alter
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.requires_postgres
def test_postgresql_refusing_writes_takes_the_server_out_of_rotation_until_it_takes_them(
    fresh_pg_database: tuple[str, Callable[[str], None]], tmp_path: Path
) -> None:
    url, alter = fresh_pg_database
    name = urlparse(url).path.lstrip("/")
    config = tmp_path / "server.toml"
    config.write_text("global_quotas = false\n")  # the quotas' leases would refuse first
    with (
        ptc_serve(
            "--audit-db", url, "--config", str(config), "--pool-size", "2",
            "--instance-id", "pg-refuses", "--metrics-listen", "127.0.0.1:0",
        ) as served,
        Client(served.address) as client,
        ThreadPoolExecutor(1) as pool,
    ):  # fmt: skip
        _wait_until("ready", lambda: _readiness(served.address) == SERVING)
        assert client.execute("print('before')").stdout == "before\n"
        _entered, release, gated = _gated_execution(client, pool)
        with _Load(client) as load:
            _wait_until("the load runs", lambda: load.seen("ok") >= LOAD_THREADS)
            alter(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
            refusing_at = time.monotonic()
            release.set()
            result = gated.result(WAIT_S)
            assert (result.status, len(result.stdout)) == ("ok", BIG_OUTPUT + 1), result
            _wait_until("not ready", lambda: _readiness(served.address) == NOT_SERVING)
            _wait_until(
                "a refusal naming PostgreSQL's error",
                lambda: any(
                    # An admission's first write locks the tenant's chain head.
                    "cannot execute SELECT FOR UPDATE in a read-only transaction" in message
                    for at, kind, message in list(load.outcomes)
                    if at >= refusing_at
                ),
            )
            assert _metric(served.metrics_address, "ptc_audit_completions_pending") >= 1
            alter(f"ALTER DATABASE {name} RESET default_transaction_read_only")
            writable_at = time.monotonic()
            _wait_until("ready again", lambda: _readiness(served.address) == SERVING)
            _wait_until("served again", lambda: load.seen("ok", writable_at) >= 5)
        assert _metric(served.metrics_address, "ptc_audit_completions_pending") == 0
        for kind, message in _store_errors(load):
            assert kind == "Unavailable", (kind, message)
            assert message.startswith("execution not admitted: "), message
            assert "audit store: " in message, message  # the store's own error follows
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            statuses: dict[str, int] = dict(
                conn.execute("SELECT status, COUNT(*) FROM executions GROUP BY 1")
            )
            gated_status = conn.execute(
                "SELECT status FROM executions WHERE execution_id = %s", (result.execution_id,)
            ).fetchall()
        assert "running" not in statuses, statuses
        assert statuses["ok"] == 2 + load.seen("ok"), statuses
        assert gated_status == [("ok",)]
    verify = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", "verify", "--db", url],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
