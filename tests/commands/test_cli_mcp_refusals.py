"""`ptc mcp`'s argument refusals (`sandbox.commands.mcp`): each names the flag that was wrong
and why, exits 2 with nothing on standard output (the MCP channel under stdio), and creates no
audit file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens there: the refusals need no server.
NOWHERE = "127.0.0.1:1"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--server", NOWHERE, "--audit-db", "{db}"],
            "ptc mcp: --audit-db: with --server the server keeps the audit records\n",
        ),
        (
            ["--server", NOWHERE, "--session", "--transport", "streamable-http"],
            "ptc mcp: --session: only with --transport stdio (over HTTP many conversations "
            "would share one session's state)\n",
        ),
        (
            ["--tls-ca", "{db}", "--audit-db", "{db}"],
            "ptc mcp: --tls-ca: TLS is for a server; give --server ADDR too\n",
        ),
    ],
    ids=["audit-db-with-server", "session-over-http", "tls-without-server"],
)
def test_ptc_mcp_refuses_before_starting(tmp_path: Path, flags: list[str], message: str) -> None:
    db = tmp_path / "audit.db"
    done = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "mcp", *(f.format(db=db) for f in flags)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", message)
    assert not db.exists()
