"""`bench.store_copy`: a SQLite store filled by the store's own code, copied into PostgreSQL,
reads back the same and its chain verifies there; a copy into a store that holds rows, and a
copy of a store whose chain was edited, are refused."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from bench import point_reads
from bench.harness import Report
from bench.scale_history import admission, result
from bench.session_rebuild import TENANT, prefill
from bench.store_copy import copy_store
from sandbox.audit import AuditQuery, open_store
from tests.postgres_support import fresh_schema


def _report(tmp_path: Path) -> Report:
    return Report("store_copy", argparse.Namespace(json_out=str(tmp_path / "r.json")))


@pytest.mark.requires_postgres
def test_a_copied_store_reads_back_and_verifies(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(tmp_path / "audit.db")
    report = _report(tmp_path)
    prefill(source, 300, report)
    copied = copy_store(source, pg_url, report)
    lite, pg = open_store(source), open_store(pg_url)
    try:
        rows = sum(
            int(lite._db.read_one(f"SELECT COUNT(*) FROM {table}")[0][0])
            for table in ("entries", "executions", "calls", "violations", "idempotency_keys")
        )
        assert copied >= rows > 900  # 600 entries, 300 executions, their calls and keys
        assert pg.verify().records == 300
        assert pg.by_key(TENANT, "key-148") == f"{TENANT}-000000148"
        page, _ = pg.list(TENANT, AuditQuery(limit=5))
        assert page == lite.list(TENANT, AuditQuery(limit=5))[0]
        # The copy's chain goes on: a new execution appends after the copied head.
        pg.admit(admission(TENANT, 300))
        pg.complete(f"{TENANT}-000000300", result(f"{TENANT}-000000300", 300))
        after = pg.verify()
        assert after.ok and after.records == 301
    finally:
        lite.close()
        pg.close()
    with pytest.raises(SystemExit, match="calls already holds 606 rows"):
        copy_store(source, pg_url, report)
    # bench.point_reads on the copy (at 75 keys the planner may read the table whole: the
    # plan at a size is what the bench shows; test_audit_plans checks the index's).
    reads = argparse.Namespace(
        stores=f"{pg_url}:{TENANT}:300", lookups=20, json_out=str(tmp_path / "p.json")
    )
    point_reads.main(Report("point_reads", reads), reads)
    out = capsys.readouterr().out
    assert "300: the look-up's plan: " in out and "on idempotency_keys" in out
    assert "300: buffers a look-up reads from the OS" in out


@pytest.mark.requires_postgres
def test_a_copy_whose_chain_was_edited_is_refused(tmp_path: Path) -> None:
    source = str(tmp_path / "audit.db")
    report = _report(tmp_path)
    prefill(source, 20, report)
    conn = sqlite3.connect(source)
    with conn:
        conn.execute(
            "UPDATE entries SET payload = replace(payload, 'bench', 'edited') WHERE seq = 3"
        )
    conn.close()
    with fresh_schema() as schema, pytest.raises(SystemExit, match="the copy does not verify"):
        copy_store(source, schema.url, report)
