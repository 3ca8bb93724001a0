"""`ptc session` and `ptc run --session` against a real `ptc serve` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.ptc_cli import CLIENT_ENV, run_ptc
from tests.ptc_serve import ptc_serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def ptc(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_ptc(*args, stdin=stdin, without=CLIENT_ENV)


def test_session_commands_through_ptc_serve(tmp_path: Path) -> None:
    with ptc_serve("--pool-size", "1") as serving:
        address = serving.address
        created = ptc("session", "create", "--server", address, "--idle-timeout", "60")
        assert created.returncode == 0, created.stderr
        sid = created.stdout.strip()
        assert sid.startswith("s-")
        first = ptc("run", "-", "--server", address, "--session", sid, stdin="x = 20")
        assert first.returncode == 0, first.stderr
        second = ptc("run", "-", "--json", "--server", address, "--session", sid, stdin="x += 1\nx")
        assert second.returncode == 0, second.stderr
        out = json.loads(second.stdout)
        assert (out["status"], out["value"], out["session_id"]) == ("ok", "21", sid)
        shown = json.loads(ptc("session", "show", sid, "--server", address).stdout)
        assert (shown["state"], len(shown["execution_ids"])) == ("active", 2)
        listed = ptc("session", "list", "--server", address)
        assert [json.loads(x)["session_id"] for x in listed.stdout.splitlines()] == [sid]
        closed = json.loads(ptc("session", "close", sid, "--server", address).stdout)
        assert (closed["state"], closed["end_reason"]) == (
            "closed",
            "closed by the client",
        )
        after = ptc("run", "-", "--server", address, "--session", sid, stdin="x")
        assert after.returncode == 8
        assert after.stderr.strip().endswith(
            f"server {address}: session_lost: session '{sid}' is closed: closed by the client"
        )
        unknown = ptc("session", "show", "s-none", "--server", address)
        assert unknown.returncode == 8
        assert "session_id: no session 's-none'" in unknown.stderr
        no_server = ptc("run", "-", "--session", sid, stdin="x")
        assert no_server.returncode == 2
        assert "--session: sessions live on a server; give --server ADDR too" in no_server.stderr
