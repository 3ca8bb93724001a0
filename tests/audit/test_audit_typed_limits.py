"""Effective limits are typed (`ResolvedLimits`) in admissions and results, and the chain's bytes
did not move: an entry written while they were a dict of proto names hashes, verifies and reads
back as the typed value, and the same limits written today are the same bytes.

The two payloads and hashes below were computed by the code before the limits were typed (main
at 7e996bd, `limits_fields(lim)` as its recording passed them), as constants; an entry in an
older format (a partial set, as the version 6 fixture holds) reads back as None, and still
verifies."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from sandbox.audit import Admission, AuditQuery, open_store
from sandbox.audit._codec import (
    admission_from_json,
    admission_to_json,
    canonical,
    entry_hash,
    result_to_json,
)
from sandbox.limits import DEFAULTS
from sandbox.result import ExecutionResult, ExecutionStatus
from tests.audit.audit_support import admission

LIMITS = replace(DEFAULTS, wall_time_ms=2500, memory_bytes=512 * 1024**2)
_FIELDS = (
    '{"call_log_bytes":8388608,"cpu_time_ms":10000,"file_size_bytes":16777216,'
    '"input_bytes":8388608,"input_files":64,"max_tool_calls":1000,"memory_bytes":536870912,'
    '"open_files":256,"output_bytes":16777216,"output_file_bytes":8388608,"output_files":64,'
    '"processes":64,"stderr_bytes":262144,"stdout_bytes":1048576,"wall_time_ms":2500}'
)
ADMITTED_BEFORE = (
    '{"admitted_at":1700000000.5,"backend":"process","effective_limits":' + _FIELDS + ","
    '"execution_id":"e-1","labels":{"agent":"x"},"manifest_json":"[]","manifest_sha256":'
    '"abababababababababababababababababababababababababababababababab","policy":"none",'
    '"script":"print(1)","script_sha256":'
    '"d287bb7f9d15abdc5b6e98536263815744b6ef21c8f3c839fc434ca70d8efe99","tenant":"acme"}'
)
ADMITTED_HASH = "sha256:3515a8a60c5c4fd6bba04335dc1d83517f9300cb086d98e0fb85146203cb368e"
COMPLETED_BEFORE = (
    '{"adjustments":[],"backend":"process","calls":[],"error":null,"execution_id":"e-1",'
    '"exit_code":0,"finished_at":2.0,"input_files":[],"isolation":[],"limits":' + _FIELDS + ","
    '"omitted_outputs":[],"output_files":[],"started_at":1.0,"status":"ok","stderr":"",'
    '"stdout":"","usage":{"cpu_time_s":0.0,"peak_memory_bytes":0,"stderr_bytes":0,'
    '"stdout_bytes":0,"tool_calls":0,"wall_time_s":0.0},"violations":[]}'
)
COMPLETED_HASH = "sha256:b308af32d689bc1b016d1df577313ab5003c912feea8a0d2d906e65b64705b5e"
V6_FIXTURE = Path(__file__).parent / "fixtures" / "v6_store.sqlite3"


def _admission() -> Admission:
    # The fields the constants were computed with.
    written = admission("acme", "e-1", at=1700000000.5)
    return replace(written, manifest_json="[]", labels={"agent": "x"}, effective_limits=LIMITS)


def _result() -> ExecutionResult:
    return ExecutionResult(
        execution_id="e-1",
        status=ExecutionStatus.OK,
        effective_limits=LIMITS,
        started_at=1.0,
        finished_at=2.0,
    )


def test_typed_limits_are_written_as_the_bytes_the_dict_was() -> None:
    admitted = canonical(admission_to_json(_admission(), 1700000000.5))
    completed = canonical(result_to_json(_result()))
    assert admitted == ADMITTED_BEFORE
    assert completed == COMPLETED_BEFORE
    assert entry_hash("acme", 1, "admitted", "e-1", 1700000000500000, admitted, "") == (
        ADMITTED_HASH
    )
    assert entry_hash("acme", 2, "completed", "e-1", 1700000002000000, completed, "x") == (
        COMPLETED_HASH
    )


def test_an_entry_written_before_reads_back_typed() -> None:
    admission = admission_from_json(json.loads(ADMITTED_BEFORE))
    assert admission == _admission()
    assert admission.effective_limits == LIMITS
    result = ExecutionResult.from_json(json.loads(COMPLETED_BEFORE))
    assert result.effective_limits == LIMITS
    assert result == _result()


def test_a_store_keeps_the_same_limits_text_and_reads_them_typed(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "audit.sqlite3"), instance="srv")
    try:
        store.admit(_admission())
        store.complete("e-1", _result())
        assert store.verify().problems == []
        record = store.get("acme", "e-1")
        assert record is not None and record.result is not None
        assert record.admission.effective_limits == LIMITS
        assert record.result.effective_limits == LIMITS
        # White box (the store's seam): the stored texts hold the limits as before, byte for byte.
        rows = store._db.read_one(
            "SELECT kind, payload FROM entries WHERE execution_id = ? ORDER BY seq", ("e-1",)
        )
        payloads = {str(kind): str(payload) for kind, payload in rows}
        assert payloads["completed"] == COMPLETED_BEFORE
        assert '"effective_limits":' + _FIELDS + "," in payloads["admitted"]
    finally:
        store.close()


def test_entries_in_an_older_format_verify_and_read_back_without_limits(tmp_path: Path) -> None:
    # Written by the code of schema version 6 with a partial set of limits (floats in the
    # admission, integers in the result): no complete set, so none is made up.
    path = tmp_path / "audit.sqlite3"
    shutil.copy(V6_FIXTURE, path)
    store = open_store(str(path), instance="srv-a")
    try:
        assert store.verify().problems == []
        records, _ = store.list("t2", AuditQuery(limit=100))
        assert records
        for record in records:
            assert record.admission.effective_limits is None
            assert record.result is None or record.result.effective_limits is None
            if record.result is not None:
                assert record.result.to_json()["limits"] == {}
    finally:
        store.close()
