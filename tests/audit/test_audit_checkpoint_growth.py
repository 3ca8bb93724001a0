"""A checkpoint costs what was appended since the last one, and `verify --since-checkpoint`
starts from a signed checkpoint: both over a real SQLite file and a real PostgreSQL.

The publisher's reads are observed by wrapping the store's own methods (the store and its
database stay real): after its first checkpoint of a tenant, a round reads the heads and the
entries after the last covered one, never the whole chain; a tenant with nothing new reads
nothing; a restarted publisher starts from the store's frontier row once its root is the signed
root, and rebuilds from the first entry when the row was edited. Every checkpoint's root is
checked against the root of the whole tree built from scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox.audit import SqlAuditStore
from sandbox.audit.checkpoints import Checkpoint, generate_key, load_private_key, tenant_tree
from sandbox.audit.publisher import HISTORY_FILE, CheckpointPublisher
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb
from tests.ptc_cli import run_ptc as ptc


def _fill(store: SqlAuditStore, tenant: str, count: int) -> None:
    for _ in range(count):
        adm = admission(tenant)
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id))


class _Reads:
    """Counts what the publisher reads through two of the store's methods."""

    def __init__(self, store: SqlAuditStore) -> None:
        self.hashes: list[int] = []  # rows returned by each hashes_after
        self.full: int = 0  # calls of chain_hashes (the whole chain)
        self._wrap(store, "hashes_after", lambda rows: self.hashes.append(len(rows)))
        self._wrap(store, "chain_hashes", lambda rows: setattr(self, "full", self.full + 1))

    @staticmethod
    def _wrap(store: SqlAuditStore, name: str, note: Callable[[Any], None]) -> None:
        real = getattr(store, name)

        def spy(*args: Any) -> Any:
            rows = real(*args)
            note(rows)
            return rows

        setattr(store, name, spy)


def _whole_root(store: SqlAuditStore, tenant: str) -> tuple[int, bytes]:
    tree = tenant_tree(SqlAuditStore.chain_hashes(store, tenant), tenant)
    return tree.size, tree.root()


def test_a_round_reads_what_was_appended_since_the_last_checkpoint(
    audit_db: AuditDb, tmp_path: Path
) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    reads = _Reads(store)
    publisher = CheckpointPublisher(store, key, directory=tmp_path / "cps")
    _fill(store, "acme", 5)
    _fill(store, "quiet", 2)
    first = publisher.publish_once()
    assert [(c.tenant, c.tree_size) for c in first] == [("acme", 10), ("quiet", 4)]
    assert reads.hashes == [10, 4] and reads.full == 0  # a first checkpoint reads everything
    for count in (1, 3, 8, 17):
        reads.hashes.clear()
        _fill(store, "acme", count)
        (grown,) = publisher.publish_once()  # "quiet" has nothing new: not read at all
        assert reads.hashes == [2 * count + 1]  # the last covered entry and the new ones
        assert (grown.tree_size, grown.root_hash) == _whole_root(store, "acme")
    assert reads.full == 0
    reads.hashes.clear()
    assert publisher.publish_once() == []
    assert reads.hashes == []


def test_a_restart_starts_from_the_stored_frontier_unless_it_was_edited(
    audit_db: AuditDb, tmp_path: Path
) -> None:
    store = audit_db.open()
    key = Ed25519PrivateKey.generate()
    CheckpointPublisher(store, key, directory=tmp_path / "cps").publish_once()  # empty store
    _fill(store, "acme", 6)
    assert [
        c.tree_size
        for c in CheckpointPublisher(store, key, directory=tmp_path / "cps").publish_once()
    ] == [12]
    _fill(store, "acme", 2)
    reads = _Reads(store)
    restarted = CheckpointPublisher(store, key, directory=tmp_path / "cps")
    (grown,) = restarted.publish_once()
    assert reads.full == 0 and reads.hashes == [5]
    assert (grown.tree_size, grown.root_hash) == _whole_root(store, "acme")
    # An edited frontier row does not match the signed root: the tree is rebuilt (and right).
    audit_db.raw(
        "UPDATE merkle_frontiers SET nodes = ? WHERE tenant = 'acme' AND tree_size = 16",
        ("00" * 32,),
    )
    _fill(store, "acme", 1)
    reads = _Reads(store)
    (again,) = CheckpointPublisher(store, key, directory=tmp_path / "cps").publish_once()
    assert reads.full == 2  # the whole tree, checked against the checkpoint, then its frontier
    assert (again.tree_size, again.root_hash) == _whole_root(store, "acme")


def test_verify_since_checkpoint_starts_after_the_signed_entry(
    audit_db: AuditDb, tmp_path: Path
) -> None:
    store = audit_db.open()
    key_path = tmp_path / "ck.key"
    kid = generate_key(key_path)
    publisher = CheckpointPublisher(store, load_private_key(str(key_path)), directory=tmp_path)
    _fill(store, "acme", 5)
    running = admission("acme")
    store.admit(running)  # admitted before the checkpoint, completed after it
    publisher.publish_once()
    store.complete(running.execution_id, result(running.execution_id))
    _fill(store, "acme", 3)
    history = str(tmp_path / HISTORY_FILE)
    args = ("--db", audit_db.target, "--public-key", f"{key_path}.pub", "--tenant", "acme")
    since = ptc("audit", "verify", "--since-checkpoint", history, *args)
    assert since.returncode == 0, since.stderr
    assert since.stdout.splitlines() == [
        f"since checkpoint: tenant acme from entry 12 (key {kid})",
        # The executions admitted after it, and the one admitted before it and completed
        # after it (its rows, read by its id): nothing else before it was read.
        "ok: 4 records verified",
    ]
    assert store.verify("acme", (11, _entry(audit_db, 11))).ok

    # An edit after the checkpoint is found; one before it only by a full verification (and
    # by `verify --checkpoint`), which is what starting from a checkpoint means.
    audit_db.raw(
        "UPDATE entries SET payload = REPLACE(payload, 'done', 'DONE') "
        "WHERE tenant = 'acme' AND seq IN (4, 14)"
    )
    broken = ptc("audit", "verify", "--since-checkpoint", history, *args)
    assert broken.returncode == 1
    (problem,) = broken.stderr.splitlines()
    assert "(entry 14, completed): content does not match its hash: edited" in problem
    full = store.verify("acme").problems
    assert [p for p in full if "(entry 4, completed)" in p]

    # A frontier row that is not the signed tree is refused, not trusted.
    audit_db.raw("UPDATE merkle_frontiers SET last_hash = ? WHERE tenant = 'acme'", ("ab" * 32,))
    refused = ptc("audit", "verify", "--since-checkpoint", history, *args)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"ptc audit verify: checkpoint of tenant acme at size 11 (key {kid}): the store holds "
        "no tree frontier at that size with the checkpoint's root (edited, or never written by "
        "a publisher); verify without --since-checkpoint\n"
    )


def _entry(audit_db: AuditDb, seq: int) -> str:
    rows = audit_db.raw("SELECT entry_hash FROM entries WHERE tenant = 'acme' AND seq = ?", (seq,))
    return str(rows[0][0])


def _since(store: SqlAuditStore, signed: Checkpoint) -> tuple[int, str]:
    """Where `verify` starts after ``signed``: its size and the hash of its last entry, from
    the stored frontier whose root is the signed root (as `ptc audit verify` proves it)."""
    frontier = store.frontier_at("acme", signed.tree_size)
    assert frontier is not None and frontier.root() == signed.root_hash
    return signed.tree_size, frontier.last_hash


def test_verify_since_checkpoint_checks_the_rows_of_a_record_ended_after_it(
    audit_db: AuditDb, tmp_path: Path
) -> None:
    """An execution admitted before the checkpoint and completed after it had its index rows
    rewritten after the checkpoint was signed: verifying from the checkpoint compares them
    with its entries, and names it when they were tampered with."""
    store = audit_db.open()
    publisher = CheckpointPublisher(store, Ed25519PrivateKey.generate(), directory=tmp_path)
    _fill(store, "acme", 3)
    running = admission("acme", "late-one")
    store.admit(running)
    (signed,) = publisher.publish_once()
    store.complete(running.execution_id, result(running.execution_id, tools=("search", "fetch")))
    _fill(store, "acme", 2)
    since = _since(store, signed)
    clean = store.verify("acme", since)
    assert clean.ok and clean.records == 3, clean

    audit_db.raw("UPDATE executions SET status = 'error' WHERE execution_id = 'late-one'")
    assert store.verify("acme", since).problems == [
        "record late-one: executions index differs from the chain in status: edited"
    ]
    audit_db.raw("UPDATE executions SET status = 'ok' WHERE execution_id = 'late-one'")
    assert store.verify("acme", since).ok
    audit_db.raw("DELETE FROM calls WHERE execution_id = 'late-one' AND tool = 'fetch'")
    assert store.verify("acme", since).problems == [
        "record late-one: calls index differs from the chain: edited"
    ]
    # What a full verification says of the same tampering: the same problem.
    assert store.verify("acme").problems == [
        "record late-one: calls index differs from the chain: edited"
    ]


def test_verify_since_checkpoint_checks_a_session_taken_over_after_it(
    audit_db: AuditDb, tmp_path: Path
) -> None:
    """A session admitted before the checkpoint, handed over and taken over after it: its
    executions and sessions rows name the new holder, and an edit of either is named."""
    a, b = audit_db.open("srv-a"), audit_db.open("srv-b")
    publisher = CheckpointPublisher(a, Ed25519PrivateKey.generate(), directory=tmp_path)
    settings = {
        "ptc.kind": "session",
        "ptc.idle_timeout_ms": "60000",
        "ptc.max_lifetime_ms": "600000",
        "ptc.max_executions": "0",
    }
    a.admit(replace(admission("acme", "s-late", script=""), labels=settings))
    _fill(a, "acme", 2)
    (signed,) = publisher.publish_once()
    assert a.hand_over("s-late", "draining")
    assert b.take_over("acme", "s-late") == "srv-a"
    since = _since(a, signed)
    clean = a.verify("acme", since)
    assert clean.ok and clean.records == 1, clean
    audit_db.raw("UPDATE sessions SET holder = 'srv-a' WHERE session_id = 's-late'")
    audit_db.raw("UPDATE executions SET instance = 'srv-a' WHERE execution_id = 's-late'")
    assert a.verify("acme", since).problems == [
        "record s-late: executions index differs from the chain in instance: edited",
        "session s-late: sessions index differs from the chain in holder: edited",
    ]
