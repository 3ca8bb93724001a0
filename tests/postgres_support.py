"""PostgreSQL for the tests: one marker and one fresh schema.

A test that needs PostgreSQL carries ``@pytest.mark.requires_postgres`` and takes the ``pg_url``
fixture (tests/conftest.py), or enters `fresh_schema()` itself for a wider scope. The server is
the one ``PTC_TEST_POSTGRES_URL`` names (``scripts/postgres.sh start`` provides it); without it
those tests skip and say why, and fail instead under ``PTC_REQUIRE_POSTGRES=1``, which
scripts/test.sh sets, so the tier cannot drop out of CI quietly. Each schema is new, selected
through the URL's ``search_path``, and dropped afterwards: tests never see each other's rows.

A test that must change the server itself (stop and start it, change a server setting) runs a
`PrivateCluster` of its own instead, never the shared one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from tests.ptc_cli import ROOT

POSTGRES_URL = os.environ.get("PTC_TEST_POSTGRES_URL", "")
REQUIRE_POSTGRES = "PTC_REQUIRE_POSTGRES"
UNSET_REASON = "PTC_TEST_POSTGRES_URL is unset: run `scripts/postgres.sh start` and source it"


def postgres_required() -> bool:
    return os.environ.get(REQUIRE_POSTGRES) == "1"


@dataclass(frozen=True)
class Schema:
    """A fresh schema: its name and the URL that selects it."""

    name: str
    url: str


@contextlib.contextmanager
def fresh_schema(prefix: str = "ptc_test") -> Iterator[Schema]:
    import psycopg

    assert POSTGRES_URL, UNSET_REASON
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    separator = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield Schema(name, f"{POSTGRES_URL}{separator}options=-csearch_path%3D{name}")
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


# A private cluster's socket lives in its own directory, so the port only has to be free there.
PRIVATE_PORT = os.environ.get("PTC_TEST_PRIVATE_PG_PORT", "5441")


class PrivateCluster:
    """A PostgreSQL cluster in a directory of its own (`scripts/postgres.sh`), for a test that
    stops and starts its server or changes its settings."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ptc-test-pg-")
        self.url = ""

    def _script(self, command: str) -> str:
        done = subprocess.run(
            ["scripts/postgres.sh", command],
            cwd=ROOT,
            env={**os.environ, "PTC_PG_DIR": self.dir, "PTC_PG_PORT": PRIVATE_PORT},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, f"postgres.sh {command}: {done.stdout}{done.stderr}"
        return done.stdout

    def start(self) -> None:
        exported = self._script("start").strip()
        self.url = exported.split("=", 1)[1].strip("'")

    def halt(self) -> None:
        self._script("halt")

    def remove(self) -> None:
        self._script("stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started `PrivateCluster`, stopped and deleted afterwards."""
    made = PrivateCluster()
    try:
        made.start()
        yield made
    finally:
        made.remove()
