"""A store written by schema version 6 (today's deployed servers) migrates in place, on both engines.

``fixtures/v6_store.sqlite3`` was written by the code of git 086afc5 through its own store API
(``fixtures/make_old_store.py`` says how): sessions and their cells, tools, violations, a
hand-over and take-over, an interruption, an idempotency key, a pruned prefix, two tenants. The
SQLite case opens a copy of it; the PostgreSQL case creates version 6's tables in a fresh schema
(the steps up to 6, which are never edited once applied) and copies every row of the file into
them, so both engines start from exactly what version 6 wrote. Opening the store with today's
code migrates it; then every record must read back, the chain must verify (index rows included),
each list filter must find what the old rows hold, and the store must go on taking writes.
Step 10 leaves the old admission entries as they were, their script and manifest inline, while
a new admission names its texts by digest (`sandbox.audit._contents`); both read back whole.

``fixtures/v10_store.sqlite3``, the same history written by git 7e996bd (schema version 10, the
last before step 11), checks step 11's rebuild of the idempotency keys on both engines.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit import AuditQuery, SqlAuditStore, open_store
from sandbox.audit._schema import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE, PerEngine
from sandbox.audit.base import KeyTaken
from tests.audit.audit_support import admission, result
from tests.postgres_support import fresh_schema

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE = FIXTURES / "v6_store.sqlite3"


def _rows(fixture: Path = FIXTURE) -> dict[str, tuple[list[str], list[tuple[object, ...]]]]:
    """Every table of a fixture store: its columns and its rows."""
    conn = sqlite3.connect(fixture)
    try:
        out = {}
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cursor = conn.execute(f"SELECT * FROM {table}")
            out[table] = ([d[0] for d in cursor.description], cursor.fetchall())
        return out
    finally:
        conn.close()


class _PgTx:
    """What a schema step computed in Python needs of a transaction (`sandbox.audit._db.Tx`)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        cursor = self._conn.execute(sql.replace("?", "%s"), params)
        return list(cursor.fetchall()) if cursor.description else []

    def executemany(self, sql: str, rows: Any) -> None:
        self._conn.cursor().executemany(sql.replace("?", "%s"), rows)

    def stream(self, sql: str, params: Any = ()) -> Iterator[tuple[Any, ...]]:
        yield from self.execute(sql, params)


@contextlib.contextmanager
def _old_store(kind: str, tmp_path: Path, fixture: Path, version: int) -> Iterator[str]:
    """A copy of ``fixture`` (SQLite), or a fresh PostgreSQL schema at ``version`` (the steps up
    to it, which are never edited once applied) holding every row of ``fixture``."""
    if kind == "sqlite":
        path = tmp_path / "audit.sqlite3"
        shutil.copy(fixture, path)
        yield str(path)
        return
    import psycopg

    with fresh_schema() as schema:
        with psycopg.connect(schema.url, autocommit=True) as conn:
            conn.execute(VERSION_TABLE)
            for applied, steps in MIGRATIONS:
                for step in steps if applied <= version else ():
                    assert not isinstance(step, PerEngine)
                    if isinstance(step, str):
                        conn.execute(step)
                    else:
                        step(_PgTx(conn))
            for table, (columns, rows) in _rows(fixture).items():
                if rows:
                    marks = ", ".join("%s" for _ in columns)
                    with conn.cursor() as cursor:
                        cursor.executemany(
                            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                            rows,
                        )
        yield schema.url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.requires_postgres)])
def v6_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with _old_store(request.param, tmp_path, FIXTURE, 6) as target:
        yield target


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.requires_postgres)])
def v10_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with _old_store(request.param, tmp_path, FIXTURES / "v10_store.sqlite3", 10) as target:
        yield target


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
    rows = _rows()
    assert max(int(str(v)) for v, _ in rows["schema_version"][1]) == 6
    assert "session_id" not in rows["executions"][0]
    assert len(rows["entries"][1]) == 28  # what make_old_store.py wrote, the pruned prefix gone


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


def _key_structure(store: SqlAuditStore) -> str:
    """How the engine holds ``idempotency_keys`` (white box: the store's seam)."""
    if store.engine.name == "sqlite":
        return str(
            store._db.read_one("SELECT sql FROM sqlite_master WHERE name = 'idempotency_keys'")
        )
    return str(
        store._db.read_one(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'idempotency_keys_pkey' "
            "AND schemaname = current_schema()"
        )
    )


def test_a_version_10_store_migrates_its_keys_in_place(v10_target: str) -> None:
    """Step 11 rebuilds the keys' table without rowids (SQLite) or gives its primary key the
    execution id (PostgreSQL), keeping every key: the old key still names its execution and
    still refuses a second admission; a new key is taken once; the chain verifies."""
    rows = _rows(FIXTURES / "v10_store.sqlite3")
    assert max(int(str(v)) for v, _ in rows["schema_version"][1]) == 10
    assert rows["idempotency_keys"][1] == [("t1", "k-123", "keyed-1")]
    store = open_store(v10_target, instance="srv-a")
    try:
        assert store.schema_version() == SCHEMA_VERSION == 11
        structure = _key_structure(store)
        if store.engine.name == "sqlite":
            assert structure.endswith("WITHOUT ROWID',)]"), structure
        else:
            assert "(tenant, idem_key) INCLUDE (execution_id)" in structure, structure
        assert store.verify().problems == []
        assert store.by_key("t1", "k-123") == "keyed-1"
        again = admission("t1", "keyed-2")
        with pytest.raises(KeyTaken, match="'k-123' was already admitted as execution keyed-1"):
            store.admit(replace(again, idempotency_key="k-123"))
        store.admit(replace(again, idempotency_key="k-456"))
        assert store.by_key("t1", "k-456") == "keyed-2"
        assert store.by_key("t2", "k-123") is None
        report = store.verify()
        assert report.problems == [] and report.records == 14
    finally:
        store.close()
    reopened = open_store(v10_target, instance="srv-a")  # a second open migrates nothing
    try:
        assert reopened.by_key("t1", "k-456") == "keyed-2"
        assert _key_structure(reopened) == structure
    finally:
        reopened.close()
