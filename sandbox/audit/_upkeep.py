# ruff: noqa: S608  -- SQL here is assembled from constants and "?" marks; values are bound.
"""The upkeep role of the SQL audit store: verification, retention and incremental checkpoints.

Each periodic job is paid by what changed: `verify` from a signed checkpoint reads what was
appended since (`sandbox.audit._checking`), a checkpoint round reads the heads and the new entry
hashes (`sandbox.audit._frontiers`), and `prune` removes a prefix of a tenant's chain, keeping
its hashes as Merkle leaves and recording the cut in the chain itself.
"""

from __future__ import annotations

import builtins
import json

from sandbox.audit import _contents, _frontiers
from sandbox.audit._chain import BATCH, Chain
from sandbox.audit._checking import verify_in
from sandbox.audit._codec import canonical
from sandbox.audit._db import Tx
from sandbox.audit.base import VerifyReport
from sandbox.audit.frontier import Frontier
from sandbox.errors import InvalidArgument

__all__ = ["Upkeep"]


class Upkeep(Chain):
    """Verification, retention and what checkpoints read."""

    def verify(
        self, tenant: str | None = None, since: tuple[int, str] | None = None
    ) -> VerifyReport:
        """Verifies the tenant's chain (every tenant's when None). ``since``: (n, the hash of
        entry n) from a signed checkpoint the caller verified, to start after it instead of
        at the first entry (`sandbox.audit._checking`); only with a tenant."""
        if since is not None and tenant is None:
            raise InvalidArgument("verify since a checkpoint: name the checkpoint's tenant")
        tenants = [tenant] if tenant is not None else self.tenants()
        total, problems = 0, []
        for name in tenants:
            with self._db.read() as tx:
                count, found = verify_in(tx, name, since)
            total += count
            problems += found
        return VerifyReport(tenant=tenant, records=total, problems=problems)

    def prune(self, tenant: str, before: float) -> int:
        """Deletes the tenant's oldest finished records admitted before ``before``.

        Only a prefix of the chain is removed: it ends at the last entry before which every
        execution is finished and old enough. The prefix's last hash becomes the tenant's
        checkpoint (where `verify` starts), and a ``pruned`` entry recording that checkpoint is
        appended to the chain, so pruning is itself part of the tamper-evident record.
        Returns how many records were pruned.
        """
        with self._db.write() as tx:
            self._lock_head(tx, tenant)
            cut, pruned = _prunable_prefix(tx, tenant, before)
            if cut is None:
                return 0
            # The pruned entries' hashes stay: they are leaves of the tenant's Merkle tree.
            tx.execute(
                "INSERT INTO pruned_leaves (tenant, seq, entry_hash) "
                "SELECT tenant, seq, entry_hash FROM entries WHERE tenant = ? AND seq <= ? "
                "ON CONFLICT (tenant, seq) DO NOTHING",
                (tenant, cut[0]),
            )
            _drop_rows(tx, tenant, sorted(pruned), cut[0])  # reads the admissions: first
            tx.execute("DELETE FROM entries WHERE tenant = ? AND seq <= ?", (tenant, cut[0]))
            tx.execute(
                "INSERT INTO checkpoints (tenant, seq, entry_hash) VALUES (?, ?, ?) "
                "ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, "
                "entry_hash = excluded.entry_hash",
                (tenant, cut[0], cut[1]),
            )
            payload = canonical(
                {
                    "through_seq": cut[0],
                    "through_hash": cut[1],
                    "records": len(pruned),
                    "before": before,
                }
            )
            self._append(tx, tenant, "pruned", "", payload)
        return len(pruned)

    def chain_hashes(self, tenant: str) -> builtins.list[tuple[int, str]]:
        """(sequence number, entry hash) of every entry of the tenant's chain, pruned ones
        included, in sequence order, read from one snapshot: the leaves of its Merkle tree."""
        with self._db.read() as tx:
            return [
                (int(seq), str(digest))
                for seq, digest in tx.stream(
                    "SELECT seq, entry_hash FROM pruned_leaves WHERE tenant = ? "
                    "UNION ALL SELECT seq, entry_hash FROM entries WHERE tenant = ? ORDER BY 1",
                    (tenant, tenant),
                )
            ]

    def heads(self) -> dict[str, int]:
        """Every tenant's last sequence number, in one read."""
        return _frontiers.heads(self._db)

    def hashes_after(self, tenant: str, seq: int) -> builtins.list[tuple[int, str]]:
        """`chain_hashes` after entry ``seq`` only: what was appended since a checkpoint."""
        return _frontiers.hashes_after(self._db, tenant, seq)

    def frontier_at(self, tenant: str, size: int) -> Frontier | None:
        return _frontiers.frontier_at(self._db, tenant, size)

    def save_frontier(self, tenant: str, frontier: Frontier) -> None:
        _frontiers.save_frontier(self._db, tenant, frontier)


def _prunable_prefix(tx: Tx, tenant: str, before: float) -> tuple[tuple[int, str] | None, set[str]]:
    """The longest prefix of the tenant's chain `prune` may remove, read in sequence order: (the
    sequence number and hash of its last entry, or None when there is none; the executions it
    admits). Reading stops at the first entry of an execution still running or admitted at or
    after ``before``; the prefix ends only where every execution admitted in it has all its
    entries in it. An execution admitted after that end (read before the stop, its completion
    after it) is not in the prefix: its rows stay with its entries."""
    prunable = {
        str(r[0])
        for r in tx.execute(
            "SELECT execution_id FROM executions "
            "WHERE tenant = ? AND admitted_at < ? AND status <> 'running'",
            (tenant, before),
        )
    }
    cut: tuple[int, str] | None = None
    admitted: builtins.list[str] = []  # in chain order; the prefix admits the first `through`
    through = 0
    open_ids: set[str] = set()
    for seq, kind, execution_id, digest in tx.execute(
        "SELECT seq, kind, execution_id, entry_hash FROM entries WHERE tenant = ? ORDER BY seq",
        (tenant,),
    ):
        if kind != "pruned":
            if execution_id not in prunable:
                break
            if kind == "admitted":
                open_ids.add(execution_id)
                admitted.append(execution_id)
            else:
                open_ids.discard(execution_id)
        if not open_ids:
            cut, through = (int(seq), str(digest)), len(admitted)
    return cut, set(admitted[:through])


def _pruned_names(tx: Tx, tenant: str, through_seq: int) -> tuple[set[str], set[str]]:
    """What the pruned admissions name, read from them once: the digests of their stored texts
    (`sandbox.audit._contents`) and their idempotency keys."""
    digests: set[str] = set()
    keys: set[str] = set()
    for (payload,) in tx.stream(
        "SELECT payload FROM entries WHERE tenant = ? AND seq <= ? AND kind = 'admitted'",
        (tenant, through_seq),
    ):
        data = json.loads(payload)
        digests.update(digest for _, digest in _contents.references(data) or ())
        key = data.get("idempotency_key")
        if isinstance(key, str) and key:
            keys.add(key)
    return digests, keys


def _drop_rows(tx: Tx, tenant: str, ids: builtins.list[str], through_seq: int) -> None:
    """Deletes the index, key and session rows of pruned records (their entries, up to
    ``through_seq``, go next), and the stored text no kept entry names. Each idempotency key
    goes by its primary key, named by its admission: the table has no index by execution (one
    would cost every keyed admission a write), and a key names only the execution admitted
    under it (a second admission with it is refused and leaves no entry)."""
    digests, keys = _pruned_names(tx, tenant, through_seq)
    _contents.prune_named(tx, tenant, digests, through_seq)
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        marks = ", ".join("?" for _ in chunk)
        for table in ("executions", "calls", "violations"):
            tx.execute(f"DELETE FROM {table} WHERE execution_id IN ({marks})", chunk)
        tx.execute(
            f"DELETE FROM sessions WHERE tenant = ? AND session_id IN ({marks})",
            (tenant, *chunk),
        )
    named = sorted(keys)
    for start in range(0, len(named), BATCH):
        chunk = named[start : start + BATCH]
        marks = ", ".join("?" for _ in chunk)
        tx.execute(
            f"DELETE FROM idempotency_keys WHERE tenant = ? AND idem_key IN ({marks})",
            (tenant, *chunk),
        )
