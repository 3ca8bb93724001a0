"""Scripts and manifests are stored once per tenant by their SHA-256, on both engines, and the
chain proves what it proved when each entry held them in full.

An admission entry names its script and manifest by digest (`sandbox.audit._contents`); reads
put the text back; `verify` checks every row an entry names against its digest, and names each
entry whose text was edited or deleted; retention removes the rows no kept entry names. The
database is edited with raw SQL, as someone with access to the file or server could.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from sandbox.audit import AuditQuery, SqlAuditStore
from sandbox.audit._codec import sha256_text
from sandbox.errors import PtcError
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb

SCRIPT = "import tools\nprint(tools.search(q='the same every time'))  # repeated\n"
MANIFEST = '[{"name": "search", "description": "the same manifest every time"}]'


def _run(store: SqlAuditStore, tenant: str, script: str, at: float = 0.0) -> str:
    adm = dataclasses.replace(admission(tenant, script=script, at=at), manifest_json=MANIFEST)
    store.admit(adm)
    store.complete(adm.execution_id, result(adm.execution_id))
    return adm.execution_id


def _contents(audit_db: AuditDb, tenant: str) -> dict[str, str]:
    rows = audit_db.raw("SELECT digest, body FROM contents WHERE tenant = ?", (tenant,))
    return {str(digest): str(body) for digest, body in rows}


def _admission_payloads(audit_db: AuditDb, tenant: str) -> list[str]:
    rows = audit_db.raw(
        "SELECT payload FROM entries WHERE tenant = ? AND kind = 'admitted' ORDER BY seq",
        (tenant,),
    )
    return [str(r[0]) for r in rows]


def test_a_repeated_script_and_manifest_are_stored_once_and_read_back_whole(
    audit_db: AuditDb,
) -> None:
    store = audit_db.open()
    same = [_run(store, "acme", SCRIPT, at=float(i)) for i in range(5)]
    other = _run(store, "acme", "print('once')")
    elsewhere = _run(store, "globex", SCRIPT)
    # One row per distinct text and tenant: the script, the manifest, the other script.
    assert _contents(audit_db, "acme") == {
        sha256_text(SCRIPT): SCRIPT,
        sha256_text(MANIFEST): MANIFEST,
        sha256_text("print('once')"): "print('once')",
    }
    assert set(_contents(audit_db, "globex")) == {sha256_text(SCRIPT), sha256_text(MANIFEST)}
    for payload in _admission_payloads(audit_db, "acme"):
        assert "the same" not in payload and "once" not in payload
        stored = json.loads(payload)
        assert stored["by_digest"] == ["manifest_json", "script"]
        assert stored["manifest_json_sha256"] == sha256_text(MANIFEST)
        assert "script" not in stored and "manifest_json" not in stored
    for execution_id in same:
        record = store.get("acme", execution_id)
        assert record is not None
        assert (record.admission.script, record.admission.manifest_json) == (SCRIPT, MANIFEST)
        assert record.script_sha256 == sha256_text(SCRIPT)
    found = store.find(other)  # `ptc audit show`
    assert found is not None and found.admission.script == "print('once')"
    listed, _ = store.list("globex", AuditQuery(limit=10))
    assert [r.admission.script for r in listed] == [SCRIPT]
    assert listed[0].admission.execution_id == elsewhere
    # Another store on the same database (another server of a fleet; nothing cached) too.
    fresh = audit_db.open("test-host-2")
    again = fresh.get("acme", same[2])
    assert again is not None and again.admission.script == SCRIPT
    assert store.verify().ok


def test_an_edited_script_fails_verify_naming_every_entry_and_is_never_read(
    audit_db: AuditDb,
) -> None:
    store = audit_db.open()
    ids = [_run(store, "acme", SCRIPT) for _ in range(2)]
    kept = _run(store, "acme", "print('untouched')")
    _run(store, "globex", SCRIPT)
    audit_db.raw(
        "UPDATE contents SET body = ? WHERE tenant = 'acme' AND digest = ?",
        ("print('forged')", sha256_text(SCRIPT)),
    )
    report = store.verify("acme")
    digest = sha256_text(SCRIPT)
    assert report.problems == [
        f"record {i} (entry {seq}, admitted): its script (sha256 {digest}) does not match its "
        "digest: edited"
        for i, seq in zip(ids, (1, 3), strict=True)
    ]
    assert store.verify("globex").ok  # the other tenant's row is its own
    fresh = audit_db.open("test-host-2")  # nothing cached: the row is read and refused
    with pytest.raises(PtcError, match=f"record {ids[0]}: its script .* does not match"):
        fresh.get("acme", ids[0])
    untouched = fresh.get("acme", kept)
    assert untouched is not None and untouched.admission.script == "print('untouched')"


def test_a_deleted_manifest_fails_verify_and_verify_since_a_checkpoint(audit_db: AuditDb) -> None:
    store = audit_db.open()
    first = _run(store, "acme", SCRIPT)
    head = audit_db.raw("SELECT seq, head_hash FROM chain_heads WHERE tenant = 'acme'")[0]
    later = _run(store, "acme", "print('later')")
    audit_db.raw("DELETE FROM contents WHERE digest = ?", (sha256_text(MANIFEST),))
    digest = sha256_text(MANIFEST)
    missing = "its manifest_json (sha256 {}) is missing from the store's contents: deleted"
    assert store.verify("acme").problems == [
        f"record {first} (entry 1, admitted): {missing.format(digest)}",
        f"record {later} (entry 3, admitted): {missing.format(digest)}",
    ]
    since = store.verify("acme", (int(head[0]), str(head[1])))
    assert since.problems == [f"record {later} (entry 3, admitted): {missing.format(digest)}"]
    with pytest.raises(PtcError, match=f"record {later}: its manifest_json .* is missing"):
        audit_db.open("test-host-2").get("acme", later)


def test_a_digest_changed_in_the_entry_breaks_its_hash(audit_db: AuditDb) -> None:
    """Storing a forged text under its own digest and pointing the entry at it is an edit of
    the entry, which its hash covers."""
    store = audit_db.open()
    victim = _run(store, "acme", SCRIPT)
    forged = "print('forged')"
    audit_db.raw(
        "INSERT INTO contents (tenant, digest, last_seq, body) VALUES ('acme', ?, 1, ?)",
        (sha256_text(forged), forged),
    )
    audit_db.raw(
        "UPDATE entries SET payload = REPLACE(payload, ?, ?) WHERE execution_id = ?",
        (sha256_text(SCRIPT), sha256_text(forged), victim),
    )
    problems = store.verify("acme").problems
    assert f"record {victim} (entry 1, admitted): content does not match its hash: edited or " in (
        "".join(problems)
    )


def test_a_last_use_moved_back_is_caught_before_retention_could_act_on_it(
    audit_db: AuditDb,
) -> None:
    store = audit_db.open()
    _run(store, "acme", SCRIPT)
    last = _run(store, "acme", SCRIPT)
    audit_db.raw("UPDATE contents SET last_seq = 1 WHERE digest = ?", (sha256_text(SCRIPT),))
    assert store.verify("acme").problems == [
        f"record {last} (entry 3, admitted): its script (sha256 {sha256_text(SCRIPT)}) is "
        "noted as last named before it, so retention could remove it: contents edited"
    ]


def test_retention_removes_the_text_no_kept_entry_names(audit_db: AuditDb) -> None:
    store = audit_db.open()
    _run(store, "acme", "print('old only')", at=1.0)
    _run(store, "acme", SCRIPT, at=2.0)
    kept = _run(store, "acme", SCRIPT, at=100.0)
    _run(store, "globex", "print('old only')", at=1.0)
    assert store.prune("acme", before=50.0) == 2
    assert set(_contents(audit_db, "acme")) == {sha256_text(SCRIPT), sha256_text(MANIFEST)}
    assert sha256_text("print('old only')") in _contents(audit_db, "globex")  # not its tenant
    record = store.get("acme", kept)
    assert record is not None and record.admission.script == SCRIPT
    assert store.verify().ok
    assert store.prune("acme", before=1000.0) == 1
    assert _contents(audit_db, "acme") == {}
    assert store.verify().ok
    # Written again after its rows went: stored again, and read back.
    again = _run(store, "acme", SCRIPT, at=2000.0)
    record = audit_db.open("test-host-2").get("acme", again)
    assert record is not None and record.admission.script == SCRIPT
    assert store.verify().ok
