"""The store's side of incremental checkpoints: chain heads, new leaves, Merkle frontiers.

What a checkpoint round reads is what changed: every tenant's head in one statement (a tenant
whose head did not move costs nothing more), the entry hashes after the last signed size (the
entries' primary key, from that point), and the frontier row at that size (its primary key).
"""

from __future__ import annotations

from sandbox.audit._db import Db
from sandbox.audit.frontier import Frontier

__all__ = ["frontier_at", "hashes_after", "heads", "save_frontier"]


def heads(db: Db) -> dict[str, int]:
    """Every tenant's last sequence number."""
    return {str(t): int(seq) for t, seq in db.read_one("SELECT tenant, seq FROM chain_heads")}


def hashes_after(db: Db, tenant: str, seq: int) -> list[tuple[int, str]]:
    """(sequence number, entry hash) of the tenant's entries after ``seq``, pruned ones
    included, in sequence order, from one snapshot."""
    with db.read() as tx:
        return [
            (int(n), str(digest))
            for n, digest in tx.stream(
                "SELECT seq, entry_hash FROM pruned_leaves WHERE tenant = ? AND seq > ? "
                "UNION ALL SELECT seq, entry_hash FROM entries WHERE tenant = ? AND seq > ? "
                "ORDER BY 1",
                (tenant, seq, tenant, seq),
            )
        ]


def frontier_at(db: Db, tenant: str, size: int) -> Frontier | None:
    """The stored frontier of the tenant's tree at ``size``; None when there is none or it is
    not well formed (either way the caller rebuilds or refuses: a row is never trusted alone)."""
    rows = db.read_one(
        "SELECT nodes, last_hash, last_path FROM merkle_frontiers "
        "WHERE tenant = ? AND tree_size = ?",
        (tenant, size),
    )
    if not rows:
        return None
    try:
        return Frontier.from_row(size, str(rows[0][0]), str(rows[0][1]), str(rows[0][2]))
    except ValueError:
        return None


def save_frontier(db: Db, tenant: str, frontier: Frontier) -> None:
    nodes, last_hash, last_path = frontier.to_row()
    with db.write() as tx:
        tx.execute(
            "INSERT INTO merkle_frontiers (tenant, tree_size, nodes, last_hash, last_path) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, tree_size) DO NOTHING",
            (tenant, frontier.size, nodes, last_hash, last_path),
        )
