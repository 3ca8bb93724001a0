"""Signed audit checkpoints over a real SQLite file and a real PostgreSQL: truncation of a
tenant's newest records (with its head) passes the chain check but not an earlier checkpoint;
forged checkpoints are rejected; the publisher writes, skips and refuses as documented; and the
whole flow works through the `ptc audit` command line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox.audit import SqlAuditStore
from sandbox.audit.checkpoints import (
    Checkpoint,
    generate_key,
    key_id,
    load_private_key,
    load_public_keys,
    read_checkpoints,
    sign_checkpoint,
    tenant_tree,
    verify_checkpoint,
)
from sandbox.audit.publisher import HISTORY_FILE, CheckpointPublisher
from sandbox.errors import InvalidArgument
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb
from tests.ptc_cli import run_ptc as ptc


def _fill(
    store: SqlAuditStore, tenant: str, count: int, start: float = 1_700_000_000.0
) -> list[str]:
    ids = []
    for i in range(count):
        adm = admission(tenant, at=start + i)
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id))
        ids.append(adm.execution_id)
    return ids


def _truncate(db: AuditDb, tenant: str, keep_entries: int) -> None:
    """What an attacker with write access does to hide the newest records: delete the entries
    after ``keep_entries``, their index rows, and move the head back (or delete it) so that the
    shorter chain is valid on its own."""
    gone = [
        str(r[0])
        for r in db.raw(
            "SELECT DISTINCT execution_id FROM entries WHERE tenant = ? AND seq > ?",
            (tenant, keep_entries),
        )
    ]
    db.raw("DELETE FROM entries WHERE tenant = ? AND seq > ?", (tenant, keep_entries))
    for execution_id in gone:
        for table in ("executions", "calls", "violations"):
            db.raw(f"DELETE FROM {table} WHERE execution_id = ?", (execution_id,))
    if keep_entries == 0:
        db.raw("DELETE FROM chain_heads WHERE tenant = ?", (tenant,))
        return
    (digest,) = db.raw(
        "SELECT entry_hash FROM entries WHERE tenant = ? AND seq = ?", (tenant, keep_entries)
    )[0]
    db.raw(
        "UPDATE chain_heads SET seq = ?, head_hash = ? WHERE tenant = ?",
        (keep_entries, digest, tenant),
    )


def _checkpoint(store: SqlAuditStore, key: Ed25519PrivateKey, tenant: str) -> Checkpoint:
    tree = tenant_tree(store.chain_hashes(tenant), tenant)
    return sign_checkpoint(key, tenant, tree.size, tree.root(), "test", now=1_700_000_000.0)


def _verify(store: SqlAuditStore, checkpoint: Checkpoint, *keys: Ed25519PrivateKey) -> list[str]:
    public = {key_id(k.public_key()): k.public_key() for k in keys}
    tree = tenant_tree(store.chain_hashes(checkpoint.tenant), checkpoint.tenant)
    return verify_checkpoint(checkpoint, public, tree)


@pytest.mark.parametrize("keep", [6, 3, 0], ids=["newest-records", "mid-record", "all-and-head"])
def test_truncation_passes_the_chain_check_but_not_an_earlier_checkpoint(
    audit_db: AuditDb, keep: int
) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    _fill(store, "acme", 4)
    _fill(store, "globex", 2)
    earlier = _checkpoint(store, key, "acme")
    assert earlier.tree_size == 8
    assert _verify(store, earlier, key) == []
    _truncate(audit_db, "acme", keep)
    if keep % 2 == 0:  # cut between records: the chain alone cannot tell
        assert store.verify().ok, store.verify().problems
    kid = key_id(key.public_key())
    assert _verify(store, earlier, key) == [
        f"checkpoint of tenant acme at size 8 (key {kid}): the store holds only {keep} entries "
        f"of tenant acme (its chain ends at entry {keep}): entries {keep + 1}..8 that the "
        "checkpoint covers were removed: truncated"
    ]
    # Other tenants' checkpoints are unaffected.
    assert _verify(store, _checkpoint(store, key, "globex"), key) == []


def test_truncated_then_regrown_past_the_checkpoint_fails_the_consistency_proof(
    audit_db: AuditDb,
) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    _fill(store, "acme", 3)
    earlier = _checkpoint(store, key, "acme")
    _truncate(audit_db, "acme", 2)
    _fill(store, "acme", 5, start=1_800_000_000.0)  # the chain is longer than before, valid
    assert store.verify().ok
    kid = key_id(key.public_key())
    assert _verify(store, earlier, key) == [
        f"checkpoint of tenant acme at size 6 (key {kid}): the store's tree of size 12 is not "
        "consistent with the checkpoint (consistency proof from 6 to 12 fails): entries 1..6 "
        "were edited, replaced or reordered"
    ]


def test_growth_and_pruning_keep_earlier_checkpoints_valid(audit_db: AuditDb) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    sizes: list[int] = []
    checkpoints = []
    for _ in range(4):
        _fill(store, "acme", 3, start=1_000.0 + 10 * len(sizes))
        checkpoints.append(_checkpoint(store, key, "acme"))
        sizes.append(checkpoints[-1].tree_size)
    assert sizes == [6, 12, 18, 24]
    assert store.prune("acme", before=1_015.0) == 6  # entries 1..12 leave the table
    assert audit_db.raw("SELECT COUNT(*) FROM pruned_leaves WHERE tenant = 'acme'")[0][0] == 12
    assert store.verify().ok
    for checkpoint in checkpoints:
        assert _verify(store, checkpoint, key) == []
    # A pruned leaf edited afterwards breaks the checkpoints that cover it.
    audit_db.raw("UPDATE pruned_leaves SET entry_hash = 'sha256:00' WHERE seq = 3")
    assert all("consistency proof from" in _verify(store, c, key)[0] for c in checkpoints)


def test_forged_checkpoints_are_rejected(audit_db: AuditDb) -> None:
    store = audit_db.open()
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    _fill(store, "acme", 2)
    real = _checkpoint(store, key, "acme")
    kid = key_id(key.public_key())
    where = f"checkpoint of tenant acme at size 4 (key {kid})"
    forged_signature = f"{where}: the signature does not verify: forged or altered checkpoint"
    flipped = bytes([real.signature[0] ^ 1]) + real.signature[1:]
    cases = {
        "bad signature": Checkpoint(**{**real.__dict__, "signature": flipped}),
        "smaller size": Checkpoint(**{**real.__dict__, "tree_size": 2}),
        "other root": Checkpoint(**{**real.__dict__, "root_hash": bytes(32)}),
        "other tenant": Checkpoint(**{**real.__dict__, "tenant": "globex"}),
        "signed by another key claiming this key's id": Checkpoint(
            **{
                **real.__dict__,
                "signature": other.sign(real.signed_message()),
            }
        ),
    }
    for name, forged in cases.items():
        problems = _verify(store, forged, key)
        assert len(problems) == 1, name
        assert problems[0].endswith(": the signature does not verify: forged or altered checkpoint")
    assert _verify(store, cases["bad signature"], key) == [forged_signature]
    # Signed by a key that is not trusted: named, with the keys that are.
    by_other = _checkpoint(store, other, "acme")
    assert _verify(store, by_other, key) == [
        f"checkpoint of tenant acme at size 4 (key {key_id(other.public_key())}): signed by a "
        f"key that is not among the public keys given ({kid})"
    ]
    # Rotation: with both public keys, checkpoints of the old and the new key verify.
    assert _verify(store, real, key, other) == []
    assert _verify(store, by_other, key, other) == []


def test_checkpoint_files_are_parsed_strictly(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    good = sign_checkpoint(key, "acme", 3, bytes(32), "o", now=1.0).to_json()
    path = tmp_path / "c.json"
    cases: list[tuple[object, str]] = [
        ([], "a checkpoint must be a JSON object"),
        ({**good, "format": "x"}, "format must be 'ptc-audit-checkpoint/v1', not 'x'"),
        ({**good, "extra": 1}, "unknown field 'extra'"),
        ({**good, "tree_size": -1}, "tree_size must be a non-negative integer"),
        ({**good, "tree_size": True}, "tree_size must be a non-negative integer"),
        ({**good, "root_hash": "sha256:zz"}, "root_hash must be 'sha256:' and 64 lowercase hex"),
        ({**good, "signature": "!!"}, "signature is not base64"),
        (
            {**good, "root_hash": "md5:" + "00" * 32},
            "root_hash must be 'sha256:' and 64 lowercase hex",
        ),
        ({**good, "signature": 7}, "signature must be a string"),
    ]
    for data, message in cases:
        path.write_text(json.dumps(data))
        with pytest.raises(InvalidArgument, match=f"^checkpoint {path}: {message}"):
            read_checkpoints(str(path))
    path.write_text(json.dumps(good) + "\n" + "{not json\n")
    with pytest.raises(InvalidArgument, match=f"^checkpoint {path}, line 2: not JSON$"):
        read_checkpoints(str(path))
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(good) + "\n")
    assert len(read_checkpoints(str(path))) == 2


def test_keys_from_files_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ck.key"
    kid = generate_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(InvalidArgument, match="exists: refusing to overwrite a key"):
        generate_key(path)
    assert key_id(load_private_key(str(path)).public_key()) == kid
    assert list(load_public_keys([f"{path}.pub"])) == [kid]
    monkeypatch.setenv("PTC_CHECKPOINT_KEY", path.read_text())
    assert key_id(load_private_key().public_key()) == kid
    second = tmp_path / "new.key"
    new_kid = generate_key(second)
    monkeypatch.setenv("PTC_CHECKPOINT_PUBLIC_KEYS", Path(f"{second}.pub").read_text())
    both = tmp_path / "both.pub"
    both.write_text(Path(f"{path}.pub").read_text() + Path(f"{second}.pub").read_text())
    assert sorted(load_public_keys([str(both)])) == sorted([kid, new_kid])
    monkeypatch.delenv("PTC_CHECKPOINT_KEY")
    monkeypatch.delenv("PTC_CHECKPOINT_PUBLIC_KEYS")
    with pytest.raises(InvalidArgument, match=r"no checkpoint key: pass a key file or set"):
        load_private_key()
    with pytest.raises(InvalidArgument, match=r"no public key to check checkpoints with"):
        load_public_keys([])
    with pytest.raises(InvalidArgument, match=f"checkpoint key {path}.pub: not an unencrypted"):
        load_private_key(f"{path}.pub")
    with pytest.raises(InvalidArgument, match=f"public key {path}: no PEM public key in it"):
        load_public_keys([str(path)])


def _failing_hook(checkpoint: Checkpoint) -> None:
    raise ZeroDivisionError("a hook that fails")


def test_publisher_writes_skips_and_refuses_a_truncated_store(
    audit_db: AuditDb, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    out = tmp_path / "checkpoints"
    publisher = CheckpointPublisher(store, key, directory=out, origin="ptc-1")
    seen: list[tuple[str, int]] = []
    publisher.add_hook(lambda c: seen.append((c.tenant, c.tree_size)))
    publisher.add_hook(_failing_hook)  # a failing hook is logged, publication goes on
    _fill(store, "acme", 2)
    _fill(store, "globex", 1)
    with caplog.at_level(logging.INFO, logger="sandbox.audit.publisher"):
        assert [(c.tenant, c.tree_size) for c in publisher.publish_once()] == [
            ("acme", 4),
            ("globex", 2),
        ]
        assert publisher.publish_once() == []  # nothing changed
        _fill(store, "acme", 1)
        assert [c.tree_size for c in publisher.publish_once()] == [6]
    assert seen == [("acme", 4), ("globex", 2), ("acme", 6)]
    latest = read_checkpoints(str(out / "acme.checkpoint.json"))
    assert [(c.tree_size, c.origin) for c in latest] == [(6, "ptc-1")]
    history = read_checkpoints(str(out / HISTORY_FILE))
    assert [(c.tenant, c.tree_size) for c in history] == [("acme", 4), ("globex", 2), ("acme", 6)]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines[0].startswith("audit checkpoint: tenant=acme tree_size=4 root=sha256:")
    assert any("hook" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)

    _truncate(audit_db, "acme", 4)
    _fill(store, "acme", 2, start=1_900_000_000.0)
    # A new publisher (a restart) reads the last checkpoint from its file and refuses too.
    restarted = CheckpointPublisher(store, key, directory=out, origin="ptc-1")
    with caplog.at_level(logging.INFO, logger="sandbox.audit.publisher"):
        assert restarted.publish_once() == []
    assert restarted.refused == 1
    assert (
        "audit checkpoint: tenant acme: the store's tree (size 8) does not extend the "
        "checkpoint at size 6: entries were removed or rewritten; not signing"
    ) in caplog.text
    # An entry deleted from what the last checkpoint covered is not re-read by a running
    # publisher, which grows the tree from the checkpoint's frontier (what was appended since)...
    audit_db.raw("DELETE FROM entries WHERE tenant = 'globex' AND seq = 1")
    _fill(store, "globex", 1)
    with caplog.at_level(logging.INFO, logger="sandbox.audit.publisher"):
        assert [(c.tenant, c.tree_size) for c in restarted.publish_once()] == [("globex", 4)]
    assert restarted.refused == 2  # acme again
    # ...the chain's own verification finds it, and so does a publisher that builds the tree.
    assert "tenant globex: entries 1..1 are missing before" in store.verify("globex").problems[0]
    fresh = CheckpointPublisher(store, key, directory=tmp_path / "fresh", origin="ptc-2")
    with caplog.at_level(logging.INFO, logger="sandbox.audit.publisher"):
        assert [(c.tenant, c.tree_size) for c in fresh.publish_once()] == [("acme", 8)]
    assert fresh.refused == 1
    assert (
        "audit checkpoint: tenant globex: entry 1 is missing from the chain: deleted; not signing"
    ) in caplog.text


def test_cli_keygen_checkpoint_and_verify(audit_db: AuditDb, tmp_path: Path) -> None:
    store = audit_db.open()
    _fill(store, "acme", 3)
    key = tmp_path / "ck.key"
    made = ptc("audit", "keygen", str(key))
    assert made.returncode == 0, made.stderr
    kid = made.stdout.split(":", 2)[0] + ":" + made.stdout.split(":", 2)[1]
    out = tmp_path / "cps"
    signed = ptc(
        "audit", "checkpoint", "--db", audit_db.target, "--key", str(key), "--dir", str(out)
    )
    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.startswith("acme: tree_size=6 root=sha256:")
    checkpoint = str(out / "acme.checkpoint.json")
    pub = f"{key}.pub"
    ok = ptc(
        "audit", "verify", "--db", audit_db.target, "--checkpoint", checkpoint, "--public-key", pub
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines() == [
        f"checkpoint ok: tenant acme at size 6 (key {kid}) is consistent with the store's tree "
        "of size 6 (proof of 0 hashes)",
        "ok: 3 records verified",
    ]
    _fill(store, "acme", 2)
    grown = ptc(
        "audit", "verify", "--db", audit_db.target, "--checkpoint", checkpoint, "--public-key", pub
    )
    assert grown.returncode == 0, grown.stderr
    assert "of size 10 (proof of 4 hashes)" in grown.stdout

    _truncate(audit_db, "acme", 4)
    broken = ptc(
        "audit", "verify", "--db", audit_db.target, "--checkpoint", checkpoint, "--public-key", pub
    )
    assert broken.returncode == 1
    assert broken.stderr == (
        f"ptc audit verify: checkpoint of tenant acme at size 6 (key {kid}): the store holds "
        "only 4 entries of tenant acme (its chain ends at entry 4): entries 5..6 that the "
        "checkpoint covers were removed: truncated\n"
    )
    assert broken.stdout == "BROKEN: 1 checkpoint(s) do not hold\n"
    # Without the checkpoint, the truncated chain verifies: the gap the checkpoint closes.
    assert ptc("audit", "verify", "--db", audit_db.target).returncode == 0

    forged = json.loads(Path(checkpoint).read_text())
    forged["tree_size"] = 4
    Path(checkpoint).write_text(json.dumps(forged))
    rejected = ptc(
        "audit", "verify", "--db", audit_db.target, "--checkpoint", checkpoint, "--public-key", pub
    )
    assert rejected.returncode == 1
    assert "the signature does not verify: forged or altered checkpoint" in rejected.stderr

    Path(checkpoint).write_text("{")
    malformed = ptc(
        "audit", "verify", "--db", audit_db.target, "--checkpoint", checkpoint, "--public-key", pub
    )
    assert malformed.returncode == 2
    assert f"checkpoint {checkpoint}, line 1: not JSON" in malformed.stderr
    nokey = ptc("audit", "verify", "--db", audit_db.target, "--checkpoint", str(out / HISTORY_FILE))
    assert nokey.returncode == 2
    assert "no public key to check checkpoints with" in nokey.stderr
