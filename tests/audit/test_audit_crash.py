"""Crash safety: a writer killed with SIGKILL mid-burst leaves a store that reopens and verifies.

A child process opens the store and admits and completes executions in a loop, reporting each
admission on stdout only after `admit` returned. It is killed with SIGKILL in the middle of the
burst; reopening the store, `mark_interrupted()` and `verify` then show every reported
admission present, unfinished ones `interrupted`, and no broken or half-written record.
(This is at the store level; the server-level variant belongs with `ptc serve --audit-db`.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.audit.conftest import AuditDb

WORKER = textwrap.dedent(
    """
    import sys
    from tests.audit.audit_support import admission, result
    from sandbox.audit import open_store

    store = open_store(sys.argv[1], instance="crash-host")
    i = 0
    while True:
        adm = admission("acme" if i % 2 else "globex", script=f"print({i})")
        store.admit(adm)
        print("A", adm.execution_id, flush=True)
        if i % 3:
            store.complete(adm.execution_id, result(adm.execution_id, tools=("search",) * 3))
            print("C", adm.execution_id, flush=True)
        i += 1
    """
)


def test_kill_9_mid_burst_leaves_a_verifiable_store(audit_db: AuditDb) -> None:
    # The worker imports the test package's helpers: the repository's root is its import root.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER, audit_db.target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    admitted: list[str] = []
    completed: set[str] = set()
    try:
        assert child.stdout is not None
        for line in child.stdout:
            kind, execution_id = line.split()
            (admitted.append if kind == "A" else completed.add)(execution_id)
            if len(admitted) >= 150:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        _, stderr = child.communicate()
    assert child.returncode == -signal.SIGKILL, stderr
    assert len(admitted) >= 150

    store = audit_db.open(instance="crash-host")
    interrupted = store.mark_interrupted()
    assert interrupted >= 1  # every third record was never completed
    report = store.verify()
    assert report.ok, report.problems
    assert report.records >= len(admitted)
    for execution_id in admitted:
        tenant = "acme" if store.get("acme", execution_id) else "globex"
        record = store.get(tenant, execution_id)
        assert record is not None, f"admitted execution {execution_id} is missing"
        if execution_id in completed:
            assert record.status == "ok" and record.result is not None
            assert len(record.result.calls) == 3
        else:
            assert record.status in ("interrupted", "ok")
    if audit_db.kind == "sqlite":
        assert audit_db.raw("PRAGMA integrity_check") == [("ok",)]
    running = audit_db.raw("SELECT COUNT(*) FROM executions WHERE status = 'running'")
    assert running[0][0] == 0

    cli = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "audit", "verify", "--db", audit_db.target],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
