"""A store written by schema version 6 (today's deployed servers) migrates in place, on both engines.

``fixtures/v6_store.sqlite3`` was written by the code of git 086afc5 through its own store API
(``fixtures/make_v6_store.py`` says how): sessions and their cells, tools, violations, a
hand-over and take-over, an interruption, an idempotency key, a pruned prefix, two tenants. The
SQLite case opens a copy of it; the PostgreSQL case creates version 6's tables in a fresh schema
(the steps up to 6, which are never edited once applied) and copies every row of the file into
them, so both engines start from exactly what version 6 wrote. Opening the store with today's
code migrates it; then every record must read back, the chain must verify (index rows included),
each list filter must find what the old rows hold, and the store must go on taking writes.
Step 10 leaves the old admission entries as they were, their script and manifest inline, while
a new admission names its texts by digest (`sandbox.audit._contents`); both read back whole.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit import AuditQuery, SqlAuditStore, open_store
from sandbox.audit._schema import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from tests.audit.audit_support import admission, result
from tests.postgres_support import fresh_schema

FIXTURE = Path(__file__).parent / "fixtures" / "v6_store.sqlite3"
TABLES = (
    "schema_version",
    "entries",
    "chain_heads",
    "checkpoints",
    "executions",
    "calls",
    "violations",
    "pruned_leaves",
    "write_probes",
    "fleet_members",
    "idempotency_keys",
    "fleet_secret",
)


def _v6_rows() -> dict[str, tuple[list[str], list[tuple[object, ...]]]]:
    conn = sqlite3.connect(FIXTURE)
    try:
        out = {}
        for table in TABLES:
            cursor = conn.execute(f"SELECT * FROM {table}")
            out[table] = ([d[0] for d in cursor.description], cursor.fetchall())
        return out
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.requires_postgres)])
def v6_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "audit.sqlite3"
        shutil.copy(FIXTURE, path)
        yield str(path)
        return
    import psycopg

    with fresh_schema() as schema:
        with psycopg.connect(schema.url, autocommit=True) as conn:
            conn.execute(VERSION_TABLE)
            for version, steps in MIGRATIONS:
                if version <= 6:
                    for step in steps:
                        assert isinstance(step, str)
                        conn.execute(step)
            for table, (columns, rows) in _v6_rows().items():
                if rows:
                    marks = ", ".join("%s" for _ in columns)
                    with conn.cursor() as cursor:
                        cursor.executemany(
                            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                            rows,
                        )
        yield schema.url


def _ids(store: SqlAuditStore, tenant: str, **query: Any) -> list[str]:
    records, token = store.list(tenant, AuditQuery(limit=100, **query))
    assert token is None
    return [r.admission.execution_id for r in records]


def _admitted(store: SqlAuditStore, execution_id: str) -> dict[str, Any]:
    """The payload of an execution's admission entry, as stored (white box: the store's seam)."""
    rows = store._db.read_one(
        "SELECT payload FROM entries WHERE execution_id = ? AND kind = 'admitted'",
        (execution_id,),
    )
    found: dict[str, Any] = json.loads(rows[0][0])
    return found


def test_the_fixture_is_a_version_6_store() -> None:
    rows = _v6_rows()
    assert max(int(str(v)) for v, _ in rows["schema_version"][1]) == 6
    assert "session_id" not in rows["executions"][0]
    assert len(rows["entries"][1]) == 28  # what make_v6_store.py wrote, the pruned prefix gone


def test_a_version_6_store_migrates_in_place(v6_target: str) -> None:
    store = open_store(v6_target, instance="srv-a")
    try:
        assert store.schema_version() == SCHEMA_VERSION
        report = store.verify()
        assert report.problems == []
        assert report.records == 13  # t1: 2 sessions, 6 cells, 2 more (4 pruned); t2: 3
        cells = ["s-0a1b-cell2", "s-0a1b-cell1", "s-0a1b-cell0"]
        assert _ids(store, "t1", session_id="s-0a1b") == cells
        assert _ids(store, "t2", session_id="s-9999") == ["t2-2", "t2-1"]
        assert _ids(store, "t1", session_id="s-ffff") == []
        assert _ids(store, "t1", tool="fetch") == [
            "s-2c3d-cell2",
            "s-2c3d-cell1",
            "s-2c3d-cell0",
            "s-0a1b-cell2",
            "s-0a1b-cell1",
            "s-0a1b-cell0",
        ]
        assert _ids(store, "t1", violation="memory") == ["s-2c3d-cell2", "s-0a1b-cell2"]
        assert _ids(store, "t1", violation="wall_time") == ["keyed-1"]
        assert _ids(store, "t1", tool="fetch", violation="memory") == [
            "s-2c3d-cell2",
            "s-0a1b-cell2",
        ]
        assert _ids(store, "t1", status="interrupted") == ["run-1", "s-0a1b"]  # srv-a restarted
        assert store.by_key("t1", "k-123") == "keyed-1"
        cell = store.get("t1", "s-0a1b-cell0")
        assert cell is not None and cell.result is not None
        assert [c.tool for c in cell.result.calls] == ["search", "fetch", "search"]
        assert cell.admission.labels["ptc.session_id"] == "s-0a1b"
        old = _admitted(store, "s-0a1b-cell0")  # step 10 left it as written: text inline
        assert "by_digest" not in old and old["script"] == cell.admission.script
        assert (
            cell.admission.script.strip() and cell.admission.manifest_json == old["manifest_json"]
        )
        assert store._db.read_one("SELECT COUNT(*) FROM contents") == [(0,)]
        taken = store.get("t1", "s-2c3d")
        assert taken is not None and taken.status == "running"
        rows = {sid: store.session("t1", sid) for sid in ("s-0a1b", "s-2c3d")}
        assert {sid: (r.state, r.holder) for sid, r in rows.items() if r} == {
            "s-0a1b": ("active", "srv-a"),  # interrupted by srv-a's restart, not ended
            "s-2c3d": ("active", "srv-b"),  # handed over by srv-a, taken over by srv-b
        }
        assert store.session("t1", "s-0a1b-cell0") is None
        holder = store.holder("t1", "s-2c3d")
        assert holder is None  # srv-b's lease row was never written (no heartbeat)
        # New writes after the migration: a cell of an old session, listed with the old ones.
        new = admission("t1", "s-0a1b-cell3")
        new = type(new)(**{**new.__dict__, "labels": {"ptc.session_id": "s-0a1b"}})
        store.admit(new)
        store.complete("s-0a1b-cell3", result("s-0a1b-cell3", tools=("fetch",)))
        assert _ids(store, "t1", session_id="s-0a1b") == ["s-0a1b-cell3", *cells]
        assert _ids(store, "t1", tool="fetch")[0] == "s-0a1b-cell3"
        stored = _admitted(store, "s-0a1b-cell3")  # written since step 10: texts by digest
        assert stored["by_digest"] == ["manifest_json", "script"] and "script" not in stored
        assert store._db.read_one("SELECT COUNT(*) FROM contents WHERE tenant = 't1'") == [(2,)]
        read = store.get("t1", "s-0a1b-cell3")
        assert read is not None
        assert (read.admission.script, read.admission.manifest_json) == (
            new.script,
            new.manifest_json,
        )
        assert store.verify().problems == []
    finally:
        store.close()
    again = open_store(v6_target, instance="srv-a")  # a second open migrates nothing
    try:
        assert again.schema_version() == SCHEMA_VERSION
        assert again.verify().problems == []
    finally:
        again.close()
