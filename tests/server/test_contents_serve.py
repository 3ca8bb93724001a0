"""Through a real `ptc serve` on a SQLite store: an execution whose script and manifest are stored
once (by digest, `sandbox.audit._contents`) comes back whole from GetExecution and
ListExecutions, also from a second server on the same store that never saw them (nothing
cached), and an edited copy of the text is refused as an error, the server serving on."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.audit._codec import sha256_text
from sandbox.client import Client
from sandbox.errors import PtcError
from tests.ptc_serve import ptc_serve

SCRIPT = "import tools\nprint(tools.lookup(q='the same script, again'))\n"
MANIFEST = json.dumps(
    [{"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}]
)


def _raw(db: Path, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        return list(conn.execute(sql, params).fetchall())


@contextlib.contextmanager
def _served(db: Path) -> Iterator[Client]:
    """A client of a fresh `ptc serve` on the store ``db``."""
    with (
        ptc_serve("--pool-size", "1", "--audit-db", str(db)) as serving,
        Client(serving.address) as client,
    ):
        yield client


def test_get_execution_returns_the_full_script_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    with _served(db) as client:
        ids = [client.execute(SCRIPT, MANIFEST).execution_id for _ in range(3)]
        for execution_id in ids:
            record = client.get_execution(execution_id)
            assert record.script == SCRIPT and record.script_sha256 == sha256_text(SCRIPT)
            assert record.result is not None and record.result.status == "ok"
    # Stored once: one row holds the script, and no admission entry carries its text.
    digest = sha256_text(SCRIPT)
    assert _raw(db, "SELECT body FROM contents WHERE digest = ?", (digest,)) == [(SCRIPT,)]
    payloads = _raw(db, "SELECT payload FROM entries WHERE kind = 'admitted'")
    assert len(payloads) == 3 and all("the same script" not in str(p[0]) for p in payloads)
    # A server started afresh on the store has nothing cached: it reads the row back.
    with _served(db) as client:
        assert client.get_execution(ids[1]).script == SCRIPT
        page = client.list_executions()
        assert [r.script for r in page.records] == [SCRIPT] * 3
    # An edited row: the record is refused with an error naming it, and the server serves on.
    _raw(db, "UPDATE contents SET body = ? WHERE digest = ?", ("print('forged')", digest))
    with _served(db) as client:
        with pytest.raises(PtcError, match=f"record {ids[0]}: its script .* does not match"):
            client.get_execution(ids[0])
        assert client.execute("print('still serving')").stdout == "still serving\n"
