"""Why a record is `interrupted` reaches the wire and the operator's commands.

A real `ptc serve` on a SQLite store holds a session and is stopped (SIGTERM): it hands the
session over, and the session's record becomes `interrupted`, the chain's entry saying why.
That reason is what `ptc audit show` and `ptc audit list` (text and JSON) print, and, from a
server started again on the same store, what `GetExecution` and `ListExecutions` carry in
`ExecutionRecord.interrupted_reason`, as the Python SDK's record type does. A record that ended
with a result carries none.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sandbox.client import Client, ExecutionQuery
from sandbox.tenants import hash_key
from tests.ptc_serve import PYTHON, ROOT, ptc_serve

KEY = "ptc-test-key-interrupted-reason-0123456789"
HANDED_OVER = "handed over: the server that held it was draining"


def _audit(*args: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "audit", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_interrupted_reason_reaches_get_list_and_ptc_audit(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(f'[[tenant]]\nid = "acme"\nkeys = ["{hash_key(KEY)}"]\n')
    db = str(tmp_path / "audit.db")
    common = ("--audit-db", db, "--tenants", str(tenants), "--pool-size", "1")
    with ptc_serve(*common) as first, Client(first.address, KEY) as client:
        session = client.session()
        session.create()
        cell = session.execute("x = 1")
        assert cell.status == "ok"
    # Stopped: the session was handed over, its record `interrupted` with the reason.
    shown = json.loads(_audit("show", session.id, "--db", db))
    assert (shown["status"], shown["interrupted_reason"]) == ("interrupted", HANDED_OVER)
    assert json.loads(_audit("show", cell.execution_id, "--db", db))["interrupted_reason"] == ""
    listed = [json.loads(line) for line in _audit("list", "--db", db, "--json").splitlines()]
    by_id = {entry["execution_id"]: entry for entry in listed}
    assert by_id[session.id]["interrupted_reason"] == HANDED_OVER
    assert by_id[cell.execution_id]["interrupted_reason"] == ""
    lines = _audit("list", "--db", db).splitlines()
    [session_line] = [line for line in lines if line.startswith(session.id)]
    assert session_line.endswith(f"  ({HANDED_OVER})"), session_line
    [cell_line] = [line for line in lines if line.startswith(cell.execution_id)]
    assert "(" not in cell_line, cell_line
    with ptc_serve(*common) as second, Client(second.address, KEY) as client:
        record = client.get_execution(session.id)
        page = client.list_executions(ExecutionQuery(status="interrupted"))
        ran = client.get_execution(cell.execution_id)
    assert (record.status, record.interrupted_reason) == ("interrupted", HANDED_OVER)
    assert [(r.execution_id, r.interrupted_reason) for r in page.records] == [
        (session.id, HANDED_OVER)
    ]
    assert (ran.status, ran.interrupted_reason) == ("ok", "")
