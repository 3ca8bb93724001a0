"""One recorder for every execution: `ptc run --audit-db` writes admit, then complete or failed,
and the result and the audit record carry the same effective limits in the proto's units.

The failing case needs an engine that raises after admission: a backend whose `acquire` fails,
at the backend seam (the only place a fake is allowed), run through the CLI's own `_execute`.
The agreeing case is the real command line in a subprocess with a real SQLite file.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.audit import AuditQuery, open_store
from sandbox.commands import run as run_command
from sandbox.engine import ExecutionRequest
from sandbox.errors import Unavailable
from sandbox.limits import LIMIT_SPECS, Limits, ResolvedLimits

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


class _BrokenBackend:
    """Starts, but cannot give a sandbox: what a backend does when its host breaks mid-run."""

    name = "process"
    capacity = None

    async def start(self) -> None:
        return None

    async def acquire(self, limits: ResolvedLimits, runtime: str | None = None) -> object:
        raise Unavailable("no sandbox could be started: the host ran out of user namespaces")

    def isolation(self) -> list[str]:
        return []

    async def close(self) -> None:
        return None


def test_cli_run_whose_execution_raises_leaves_a_failed_record(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    request = ExecutionRequest(
        script="print(1)", manifest="[]", limits=Limits(wall_time_ms=2000), backend="process"
    )
    with pytest.raises(Unavailable, match="ran out of user namespaces"):
        asyncio.run(
            run_command._execute(request, {"process": _BrokenBackend()}, audit_db=str(db))  # type: ignore[dict-item]
        )
    store = open_store(db)
    try:
        records, _ = store.list("default", AuditQuery())
        assert [r.status for r in records] == ["failed"]
        record = records[0]
        assert record.result is not None
        assert record.result.error is not None
        assert (record.result.error.type, record.result.exit_code) == ("Unavailable", -1)
        assert "ran out of user namespaces" in record.result.error.message
        assert record.admission.script == "print(1)"
        assert record.admission.effective_limits is not None
        assert record.admission.effective_limits.wall_time_ms == 2000
        assert record.result.effective_limits == record.admission.effective_limits
        assert store.verify().ok
    finally:
        store.close()


def test_result_and_audit_record_carry_the_same_limits(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--json", "--audit-db", str(db),
         "--limit", "wall_time=2", "--limit", "memory=134217728"],
        input="print('recorded')",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["limits"]["wall_time_ms"] == 2000
    assert out["limits"]["memory_bytes"] == 134217728
    assert set(out["limits"]) == {spec.field for spec in LIMIT_SPECS}
    store = open_store(db)
    try:
        record = store.get("default", out["execution_id"])
        assert record is not None and record.result is not None
        assert record.status == "ok"
        # Typed in the record; ``ptc run --json`` prints them by field, as the record keeps them.
        assert record.admission.effective_limits is not None
        assert record.admission.effective_limits.to_fields() == out["limits"]
        assert all(type(v) is int for v in out["limits"].values())
        assert record.result.effective_limits == record.admission.effective_limits
    finally:
        store.close()
