"""Tampering with the stored records is detected by `verify`, and `ptc audit verify` exits 1.

The database is edited with raw SQL, as someone with access to the file or server could.
"""

from __future__ import annotations

import subprocess
import sys

from sandbox.audit import SqlAuditStore
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


def _populate(db: AuditDb) -> tuple[SqlAuditStore, list[str]]:
    store = db.open()
    ids = []
    for i in range(5):
        adm = admission("acme", script=f"print({i})  # secret-{i}")
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id, tools=("search", "mail")))
        ids.append(adm.execution_id)
    other = admission("globex")
    store.admit(other)
    store.complete(other.execution_id, result(other.execution_id))
    assert store.verify().ok
    return store, ids


def _problems(store: SqlAuditStore) -> list[str]:
    report = store.verify()
    assert not report.ok
    assert report.records >= 1
    # The other tenant's chain is untouched and still verifies on its own.
    assert store.verify("globex").ok
    return list(report.problems)


def test_edited_entry_is_detected(audit_db: AuditDb) -> None:
    """(The script's text is a ``contents`` row the entry names by digest: its edit is
    `test_audit_contents`'s.)"""
    store, ids = _populate(audit_db)
    audit_db.raw(
        'UPDATE entries SET payload = REPLACE(payload, \'"policy":"none"\', '
        "'\"policy\":\"open\"') WHERE tenant = 'acme' AND execution_id = ? AND kind = 'admitted'",
        (ids[2],),
    )
    problems = _problems(store)
    assert any(ids[2] in p and "edited" in p for p in problems), problems
    record = store.get("acme", ids[2])
    assert record is not None and record.admission.policy == "open"


def test_edited_result_with_recomputed_hash_breaks_the_next_link(audit_db: AuditDb) -> None:
    """An editor who also recomputes the edited entry's hash still breaks the chain after it."""
    from sandbox.audit._codec import entry_hash

    store, ids = _populate(audit_db)
    row = audit_db.raw(
        "SELECT tenant, seq, kind, execution_id, at_us, payload, prev_hash FROM entries "
        "WHERE execution_id = ? AND kind = 'completed'",
        (ids[1],),
    )[0]
    payload = row[5].replace('"status":"ok"', '"status":"error"', 1)
    forged = entry_hash(row[0], row[1], row[2], row[3], row[4], payload, row[6])
    audit_db.raw(
        "UPDATE entries SET payload = ?, entry_hash = ? WHERE tenant = ? AND seq = ?",
        (payload, forged, row[0], row[1]),
    )
    problems = _problems(store)
    assert any("does not link" in p for p in problems), problems


def test_edited_index_row_is_detected(audit_db: AuditDb) -> None:
    store, ids = _populate(audit_db)
    audit_db.raw("UPDATE executions SET status = 'error' WHERE execution_id = ?", (ids[3],))
    audit_db.raw("DELETE FROM calls WHERE execution_id = ? AND tool = 'mail'", (ids[4],))
    problems = _problems(store)
    assert any(ids[3] in p and "status" in p for p in problems), problems
    assert any(ids[4] in p and "calls index" in p for p in problems), problems


def test_deleted_record_is_detected(audit_db: AuditDb) -> None:
    store, ids = _populate(audit_db)
    audit_db.raw("DELETE FROM entries WHERE execution_id = ?", (ids[1],))
    audit_db.raw("DELETE FROM executions WHERE execution_id = ?", (ids[1],))
    audit_db.raw("DELETE FROM calls WHERE execution_id = ?", (ids[1],))
    problems = _problems(store)
    assert any("missing" in p and "deleted" in p for p in problems), problems


def test_deleted_last_record_is_detected(audit_db: AuditDb) -> None:
    store, ids = _populate(audit_db)
    for table in ("entries", "executions", "calls"):
        audit_db.raw(f"DELETE FROM {table} WHERE execution_id = ?", (ids[4],))
    problems = _problems(store)
    assert any(ids[3] in p and "deleted" in p for p in problems), problems


def test_deleted_index_row_only_is_detected(audit_db: AuditDb) -> None:
    store, ids = _populate(audit_db)
    audit_db.raw("DELETE FROM executions WHERE execution_id = ?", (ids[0],))
    problems = _problems(store)
    assert any(ids[0] in p and "missing from the executions index" in p for p in problems)


def test_reordered_records_are_detected(audit_db: AuditDb) -> None:
    store, ids = _populate(audit_db)
    seqs = {
        row[0]: row[1]
        for row in audit_db.raw(
            "SELECT execution_id, seq FROM entries WHERE kind = 'admitted' AND tenant = 'acme'"
        )
    }
    a, b = seqs[ids[1]], seqs[ids[3]]
    audit_db.raw("UPDATE entries SET seq = -1 WHERE tenant = 'acme' AND seq = ?", (a,))
    audit_db.raw("UPDATE entries SET seq = ? WHERE tenant = 'acme' AND seq = ?", (a, b))
    audit_db.raw("UPDATE entries SET seq = ? WHERE tenant = 'acme' AND seq = -1", (b,))
    problems = _problems(store)
    assert any(ids[3] in p and ("reordered" in p) for p in problems), problems
    assert any(ids[1] in p for p in problems), problems


def test_cli_verify_exits_nonzero_naming_the_record(audit_db: AuditDb) -> None:
    _, ids = _populate(audit_db)
    ok = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "audit", "verify", "--db", audit_db.target],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "ok: 6 records verified" in ok.stdout
    audit_db.raw(  # the script's text, stored once by its digest
        "UPDATE contents SET body = REPLACE(body, 'secret-0', 'public-0') WHERE tenant = 'acme'"
    )
    broken = subprocess.run(
        [sys.executable, "-m", "sandbox.cli", "audit", "verify", "--db", audit_db.target],
        capture_output=True,
        text=True,
        check=False,
    )
    assert broken.returncode == 1
    assert f"record {ids[0]}" in broken.stderr
    assert "BROKEN" in broken.stdout


def test_a_cell_moved_to_another_session_in_the_index_is_detected(audit_db: AuditDb) -> None:
    """The ``session_id`` column is derived from the admission's label: an edit that moves a
    record into (or out of) a session's list is an index row that differs from the chain."""
    store, ids = _populate(audit_db)
    audit_db.raw("UPDATE executions SET session_id = 's-0bad' WHERE execution_id = ?", (ids[1],))
    problems = _problems(store)
    assert f"record {ids[1]}: executions index differs from the chain in session_id: edited" in (
        problems
    )


def test_a_calls_row_filed_under_another_admission_is_detected(audit_db: AuditDb) -> None:
    """Lists by tool page by the calls rows' ``admit_seq``: changing it would hide a record
    from a list by tool, so `verify` checks it against the execution's own."""
    store, ids = _populate(audit_db)
    audit_db.raw("UPDATE calls SET admit_seq = admit_seq + 1 WHERE execution_id = ?", (ids[3],))
    audit_db.raw("UPDATE violations SET admit_seq = 0 WHERE execution_id = ?", (ids[3],))
    problems = _problems(store)
    assert problems == [
        f"record {ids[3]}: calls or violations index filed under another admission: edited"
    ]
