"""Crash safety of the audit record, against the real server process and a real SQLite file.

A `ptc serve --audit-db FILE` is killed with SIGKILL in the middle of a burst of executions. A
restarted server marks what was running `interrupted`; then `ptc audit verify` passes and every
execution the clients saw admitted is in the store, none half-written.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import tempfile
import threading
from pathlib import Path

import psutil

from sandbox.client import Client
from sandbox.errors import PtcError
from tests.ptc_cli import run_ptc as _ptc
from tests.ptc_serve import stop_serve
from tests.server.test_serve import _start_server

BURST = 24


def test_kill_9_mid_burst_then_restart_and_verify(tmp_path: Path) -> None:
    db = str(tmp_path / "audit.db")
    proc, address = _start_server("--audit-db", db, "--instance-id", "crash-test")
    sandboxes: list[int] = []
    finished: list[str] = []
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            with Client(address) as client:
                # Half end at once, half are still sleeping when the server dies.
                script = (
                    f"print({i})"
                    if i % 2
                    else f"import time\nprint({i}, flush=True)\ntime.sleep(30)"
                )
                result = client.run(script)
                finished.append(result.execution_id)
        except PtcError as exc:  # the server died mid-call: the client's error class
            errors.append(exc.code.name)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(BURST)]
        for thread in threads:
            thread.start()
        # Wait until some executions have finished and others are running, then kill -9.
        for _ in range(200):
            if len(finished) >= 4 and len(psutil.Process(proc.pid).children(recursive=True)) > 2:
                break
            threading.Event().wait(0.05)
        sandboxes = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        stop_serve(proc, read=False)
    assert len(finished) >= 4
    assert errors, "the kill should have cut some executions off"
    # The zygote kills its sandboxes when the control socket of its dead host breaks or ends:
    # nothing of the sandboxes survives.
    alive = []
    for pid in sandboxes:
        with contextlib.suppress(psutil.NoSuchProcess):
            alive.append(psutil.Process(pid))
    _gone, still = psutil.wait_procs(alive, timeout=10)
    assert [p for p in still if p.status() != psutil.STATUS_ZOMBIE] == []

    with sqlite3.connect(db) as conn:
        statuses = dict(conn.execute("SELECT execution_id, status FROM executions").fetchall())
    running_before = {eid for eid, status in statuses.items() if status == "running"}
    assert running_before, "executions admitted but cut off by the kill are recorded as running"
    assert set(finished) <= set(statuses)

    # The restart marks them interrupted, and sweeps what the killed server left on the host
    # (its runtime directory, its cgroups); the chain verifies.
    killed_pid = proc.pid
    restarted, _address = _start_server("--audit-db", db, "--instance-id", "crash-test")
    stop_serve(restarted)
    assert restarted.returncode == 0
    for pid in (killed_pid, restarted.pid):
        assert not list(Path(tempfile.gettempdir()).glob(f"ptc-runtime-{pid}-*"))
        assert not list(Path("/tmp").glob(f"ptc-runtime-{pid}-*"))
        assert not list(Path("/sys/fs/cgroup/pids").glob(f"ptc-{pid}-*"))
    verify = _ptc("audit", "verify", "--db", db)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    listing = _ptc("audit", "list", "--db", db, "--json", "--limit", "1000")
    assert listing.returncode == 0, listing.stderr
    records = {r["execution_id"]: r for r in map(json.loads, listing.stdout.splitlines())}
    assert set(records) == set(statuses)  # every admitted execution is present
    for eid in running_before:
        assert records[eid]["status"] == "interrupted"
    for eid in finished:
        assert records[eid]["status"] == "ok"
