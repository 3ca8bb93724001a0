"""`ptc replay` on the command line, embedded: `ptc run --audit-db` records, `ptc replay`
replays from the same store (a real SQLite file; PostgreSQL and the Docker backend once each).
Exit codes: 0 identical, 1 differs, the error table's codes otherwise.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit import Admission, open_store
from sandbox.limits import DEFAULTS
from sandbox.result import ExecutionResult, ExecutionStatus
from tests.ptc_cli import run_ptc as ptc

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
MANIFEST = [
    {
        "name": "lookup",
        "description": "Looks a key up.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
        "x-ptc": {"mode": "mock", "read_only": True, "mock": {"value": 42}},
    },
    {
        "name": "delete_all",
        "description": "Deletes everything.",
        "parameters": {"type": "object", "properties": {}},
        "x-ptc": {"mode": "echo", "needs_approval": True},
    },
    {
        "name": "big",
        "description": "A large result.",
        "parameters": {"type": "object", "properties": {}},
        "x-ptc": {"mode": "mock", "read_only": True, "mock": "x" * 4000},
    },
]
SCRIPT = """\
import asyncio, tools
values = await asyncio.gather(*(tools.aio.lookup(key=k) for k in "abc"))
print([v["value"] for v in values])
try:
    tools.delete_all()
except tools.CallDenied as exc:
    print("denied:", exc)
"""


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "tools.json").write_text(json.dumps(MANIFEST))
    return tmp_path


def record(db: str, files: Path, script: str, *extra: str) -> dict[str, Any]:
    done = ptc(
        "run", "-", "--tools", str(files / "tools.json"), "--audit-db", db, "--json", *extra,
        stdin=script,
    )  # fmt: skip
    assert done.returncode in (0, 1, 3), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def replay(db: str, execution_id: str, *extra: str) -> tuple[int, dict[str, Any]]:
    done = ptc("replay", execution_id, "--audit-db", db, "--json", *extra)
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, report


def _check_identical(db: str, files: Path) -> None:
    recorded = record(db, files, SCRIPT)
    assert recorded["stdout"] == (
        "[42, 42, 42]\ndenied: 'delete_all' needs approval and no approver is connected\n"
    )
    code, report = replay(db, recorded["execution_id"])
    assert (code, report["identical"], report["differences"]) == (0, True, [])
    assert report["execution_id"] == recorded["execution_id"]
    assert report["result"]["stdout"] == recorded["stdout"]
    assert [c["status"] for c in report["result"]["calls"]] == ["ok", "ok", "ok", "denied"]
    shown = ptc("audit", "show", report["replay_execution_id"], "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["replay_of"] == recorded["execution_id"]
    verify = ptc("audit", "verify", "--db", db)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_replay_is_identical_and_recorded(files: Path) -> None:
    _check_identical(str(files / "audit.db"), files)


def test_human_output_and_exit_code_when_it_differs(files: Path) -> None:
    db = str(files / "audit.db")
    recorded = record(db, files, SCRIPT)
    changed = [dict(MANIFEST[0], **{"x-ptc": {"mode": "mock", "mock": {}}}), MANIFEST[1]]
    changed[0]["parameters"] = {
        "type": "object",
        "properties": {"key": {"type": "integer"}},
        "required": ["key"],
    }
    (files / "changed.json").write_text(json.dumps(changed))
    done = ptc(
        "replay", recorded["execution_id"], "--audit-db", db, "--tools", str(files / "changed.json")
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"replay of {recorded['execution_id']} (recorded as ")
    assert lines[0].endswith("): 9 differences")
    assert lines[1] == "── status: error  exit code: 1"
    assert [line.split()[:2] for line in lines[2:]] == [
        ["status", "changed"],
        ["exit_code", "changed"],
        ["error", "changed"],
        ["stdout", "changed"],
        ["stderr", "changed"],
        ["calls[1]", "changed"],
        ["calls[2]", "changed"],
        ["calls[3]", "changed"],
        ["calls[4]", "missing"],
    ]
    assert lines[7].split(None, 2)[2] == (
        "call 1 of 'lookup' ended ok when recorded, invalid_arguments now: argument 'key': "
        'expected integer, got "a"'
    )
    assert lines[10].split(None, 2)[2] == (
        "recorded call 4 of 'delete_all' (no arguments) was not made by the replay"
    )


def test_a_result_the_call_log_did_not_keep_cannot_be_replayed_exactly(files: Path) -> None:
    db = str(files / "audit.db")
    script = (
        "import tools\n"
        "try:\n"
        "    print(len(tools.big()))\n"
        "except tools.CallRefused as exc:\n"
        "    print('refused:', exc)\n"
    )
    recorded = record(db, files, script, "--limit", "call_log_bytes=2000")
    assert recorded["stdout"] == "4000\n"
    assert (
        recorded["calls"][0]["result"] == "[ptc: 4046 bytes of result not logged (call_log_bytes)]"
    )
    code, report = replay(db, recorded["execution_id"])
    assert code == 1
    kinds = [(d["what"], d["kind"]) for d in report["differences"]]
    # The record's call_log_bytes violation (the result it cut) is not repeated: the replay's
    # refusal fits the call log.
    assert kinds == [
        ("status", "changed"),
        ("stdout", "changed"),
        ("violations", "changed"),
        ("calls[1]", "inexact"),
    ]
    assert report["differences"][0]["recorded"] == "limit_exceeded"
    assert report["result"]["stdout"] == (
        "refused: replay: the result of recorded call 1 was not logged (call_log_bytes), so it "
        "cannot be replayed\n"
    )


def test_errors_have_their_exit_codes(files: Path) -> None:
    db = str(files / "audit.db")
    record(db, files, "print(1)")
    unknown = ptc("replay", "f" * 32, "--audit-db", db)
    assert (unknown.returncode, unknown.stderr) == (
        8,
        f"ptc replay: not found: execution_id: no execution {'f' * 32!r}\n",
    )
    store = open_store(db, instance="replay-test")
    try:
        store.admit(
            Admission("running1", "default", "print(1)", "[]", "ab" * 32, "process", "none",
                      replace(DEFAULTS, wall_time_ms=1000), expected_calls=()),
        )  # fmt: skip
    finally:
        store.close()
    # `ptc replay` marks records its instance left running only; this one stays running.
    running = ptc("replay", "running1", "--audit-db", db)
    assert (running.returncode, running.stderr) == (
        14,
        "ptc replay: failed precondition: execution running1 cannot be replayed: its record "
        "lacks a result with the tool calls' outcomes (its status is running)\n",
    )
    missing = ptc("replay", "x")
    assert missing.returncode == 2
    assert "--audit-db: is required" in missing.stderr


@pytest.mark.requires_postgres
def test_replay_from_postgresql(files: Path, pg_url: str) -> None:
    _check_identical(pg_url, files)


@pytest.mark.requires_docker
def test_replay_on_the_docker_backend(files: Path) -> None:
    db = str(files / "audit.db")
    recorded = record(db, files, SCRIPT, "--backend", "docker")
    assert recorded["backend"] == "docker"
    code, report = replay(db, recorded["execution_id"])
    assert (code, report["differences"]) == (0, [])
    assert report["result"]["backend"] == "docker"


def test_old_record_is_refused_naming_what_is_missing(files: Path) -> None:
    db = str(files / "audit.db")
    store = open_store(db, instance="replay-test")
    try:
        store.admit(
            Admission("old1", "default", "print(1)", "", "ab" * 32, "process", "none",
                      None),  # written as {}: no complete set of limits, as older records
        )  # fmt: skip
        store.complete("old1", ExecutionResult("old1", ExecutionStatus.OK, stdout="1\n"))
    finally:
        store.close()
    done = ptc("replay", "old1", "--audit-db", db)
    assert (done.returncode, done.stderr) == (
        14,
        "ptc replay: failed precondition: execution old1 cannot be replayed: its record lacks "
        "the expected call counts (expected_calls; it was recorded before replay support); the "
        "manifest's text (only its hash was kept); every effective limit in the proto's units (it "
        "was recorded in an older format)\n",
    )
