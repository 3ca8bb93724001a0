"""Fixtures for the audit store tests: the same tests over a real SQLite file and PostgreSQL.

`audit_db` is parametrised over ``sqlite`` (a file in a fresh temporary directory) and
``postgres`` (a fresh schema in the server named by ``PTC_TEST_POSTGRES_URL``, which
``scripts/postgres.sh start`` provides; without it those cases skip and say so). It opens any
number of stores on one target, runs raw SQL for the tampering tests, and cleans up.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.audit import SqlAuditStore, open_store
from tests.postgres_support import fresh_schema


class AuditDb:
    def __init__(self, kind: str, target: str, pg_admin_url: str | None = None) -> None:
        self.kind = kind
        self.target = target
        self._stores: list[SqlAuditStore] = []

    def open(self, instance: str = "test-host") -> SqlAuditStore:
        store = open_store(self.target, instance=instance)
        self._stores.append(store)
        return store

    def raw(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Runs SQL directly on the database, bypassing the store (to tamper with it)."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.target, isolation_level=None)
            try:
                return conn.execute(sql, params).fetchall()
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.target, autocommit=True) as pg, pg.cursor() as cursor:
            cursor.execute(sql.replace("?", "%s"), params)
            return list(cursor.fetchall()) if cursor.description else []

    def close(self) -> None:
        for store in self._stores:
            store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.requires_postgres)])
def audit_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditDb]:
    if request.param == "sqlite":
        db = AuditDb("sqlite", str(tmp_path / "audit.sqlite3"))
        yield db
        db.close()
        return
    with fresh_schema() as schema:
        db = AuditDb("postgres", schema.url)
        try:
            yield db
        finally:
            db.close()
