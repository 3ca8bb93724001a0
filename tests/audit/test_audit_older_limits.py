"""A record whose limits an older version wrote in another format loses nothing: `ptc audit show`,
`ptc audit export` and the result's JSON print them exactly as the record holds them (limit names
in seconds, or a partial set by field as the version 6 fixture has), the typed value stays None
(no complete set is made up), and the chain still verifies. Through the real `ptc` command line
on a real SQLite file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sandbox.audit import Admission, AuditQuery, open_store
from sandbox.audit.export import record_to_json
from sandbox.errors import InvalidLimits
from sandbox.older_limits import OlderLimits, read_limits
from sandbox.result import ExecutionResult, ExecutionStatus
from tests.ptc_cli import run_ptc as ptc

V6_FIXTURE = Path(__file__).parent / "fixtures" / "v6_store.sqlite3"
# As the version 6 code wrote them: floats by field in the admission, an int in the result.
V6_ADMITTED = {"memory_bytes": 268435456.0, "wall_time_ms": 10000.0}
V6_COMPLETED = {"wall_time_ms": 10000}
IN_SECONDS = {"wall_time": 2.5, "memory": 536870912.0}  # names, seconds and bytes


def _v6_store(tmp_path: Path) -> str:
    path = tmp_path / "audit.sqlite3"
    shutil.copy(V6_FIXTURE, path)
    return str(path)


def test_the_v6_fixtures_limits_read_back_as_recorded(tmp_path: Path) -> None:
    store = open_store(_v6_store(tmp_path), instance="srv-a")
    try:
        assert store.verify().problems == []
        records, _ = store.list("t2", AuditQuery(limit=100))
        assert sorted(r.admission.execution_id for r in records) == ["t2-0", "t2-1", "t2-2"]
        for record in records:
            assert record.admission.effective_limits is None
            assert record.admission.older_limits is not None
            assert record.admission.older_limits.to_json() == V6_ADMITTED
            assert record.result is not None and record.result.effective_limits is None
            assert record.result.to_json()["limits"] == V6_COMPLETED
            exported = record_to_json(record)
            assert exported["effective_limits"] == V6_ADMITTED
            assert exported["result"]["limits"] == V6_COMPLETED
    finally:
        store.close()


def test_ptc_audit_show_and_export_print_the_v6_limits_as_recorded(tmp_path: Path) -> None:
    db = _v6_store(tmp_path)
    shown = ptc("audit", "show", "t2-1", "--db", db, "--tenant", "t2")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert (record["effective_limits"], record["result"]["limits"]) == (V6_ADMITTED, V6_COMPLETED)
    exported = ptc("audit", "export", "--db", db, "--tenant", "t2")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [line["execution_id"] for line in lines] == ["t2-2", "t2-1", "t2-0"]
    assert [line["effective_limits"] for line in lines] == [V6_ADMITTED] * 3
    assert [line["result"]["limits"] for line in lines] == [V6_COMPLETED] * 3
    verify = ptc("audit", "verify", "--db", db)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def _check_in_seconds(db: str) -> None:
    """Records an execution as a version that kept limit names in seconds wrote it in ``db``;
    the store, `ptc audit show` and `ptc audit export` give its limits back as written."""
    older = OlderLimits(tuple(IN_SECONDS.items()))
    store = open_store(db, instance="old")
    try:
        store.admit(
            Admission("old1", "acme", "print(1)", "[]", "ab" * 32, "process", "none", None,
                      older_limits=older),
        )  # fmt: skip
        store.complete(
            "old1",
            ExecutionResult("old1", ExecutionStatus.OK, stdout="1\n", older_limits=older),
        )
        record = store.get("acme", "old1")
        assert record is not None and record.result is not None
        assert (record.admission.effective_limits, record.admission.older_limits) == (None, older)
        assert (record.result.effective_limits, record.result.older_limits) == (None, older)
        assert record.result.to_json()["limits"] == IN_SECONDS
    finally:
        store.close()
    shown = ptc("audit", "show", "old1", "--db", db)
    assert shown.returncode == 0, shown.stderr
    record_json = json.loads(shown.stdout)
    assert (record_json["effective_limits"], record_json["result"]["limits"]) == (
        IN_SECONDS,
        IN_SECONDS,
    )
    exported = ptc("audit", "export", "--db", db)
    assert exported.returncode == 0, exported.stderr
    (line,) = [json.loads(text) for text in exported.stdout.splitlines()]
    assert (line["effective_limits"], line["result"]["limits"]) == (IN_SECONDS, IN_SECONDS)
    verify = ptc("audit", "verify", "--db", db)
    assert (verify.returncode, verify.stdout) == (0, "ok: 1 records verified\n")


def test_limits_in_seconds_are_shown_and_exported_as_recorded(tmp_path: Path) -> None:
    db = str(tmp_path / "audit.sqlite3")
    _check_in_seconds(db)
    # The stored texts hold them as written (white box: the store's rows).
    store = open_store(db, instance="old")
    try:
        rows = store._db.read_one(
            "SELECT kind, payload FROM entries WHERE execution_id = ? ORDER BY seq", ("old1",)
        )
    finally:
        store.close()
    payloads = {str(kind): json.loads(str(payload)) for kind, payload in rows}
    assert payloads["admitted"]["effective_limits"] == IN_SECONDS
    assert payloads["completed"]["limits"] == IN_SECONDS


@pytest.mark.requires_postgres
def test_limits_in_seconds_on_postgresql(pg_url: str) -> None:
    _check_in_seconds(pg_url)


def test_reading_limits_keeps_the_older_format_and_refuses_what_is_no_limit() -> None:
    assert read_limits({}) == (None, None)
    assert read_limits(IN_SECONDS) == (None, OlderLimits(tuple(IN_SECONDS.items())))
    older = read_limits(V6_ADMITTED)[1]
    assert older is not None
    assert older.unrecorded() == (
        "cpu_time", "processes", "stdout_bytes", "stderr_bytes", "file_size", "max_tool_calls",
        "open_files", "call_log_bytes", "input_files", "input_bytes", "output_files",
        "output_file_bytes", "output_bytes",
    )  # fmt: skip
    with pytest.raises(InvalidLimits) as unknown:
        read_limits({"wall_clock": 1.0}, "admission.effective_limits")
    assert unknown.value.message.startswith(
        "admission.effective_limits.wall_clock: unknown limit (known: wall_time_ms, "
    )
    with pytest.raises(InvalidLimits) as text:
        read_limits({"wall_time": "10"}, "result.limits")
    assert text.value.message == "result.limits.wall_time: must be a positive number, got '10'"
    with pytest.raises(InvalidLimits) as zero:
        read_limits({"memory_bytes": 0}, "result.limits")
    assert zero.value.message == "result.limits.memory_bytes: must be a positive number, got 0"
