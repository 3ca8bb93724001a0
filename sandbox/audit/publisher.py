"""Periodic publication of signed audit checkpoints (`sandbox.audit.checkpoints`).

Every interval, for each tenant whose chain grew since its last checkpoint, the publisher grows
the tenant's Merkle tree from the last checkpoint's frontier (`sandbox.audit.frontier`) by the
entries appended since, checks that the last entry the checkpoint covers is still there with
the same hash and that none after it is missing (a store truncated or rewritten at its end under
a running server is reported and not signed over), signs a new checkpoint and publishes it
three ways:

- a log line (logger ``sandbox.audit.publisher``, level INFO; ERROR when the check fails);
- files in the checkpoint directory: ``<tenant>.checkpoint.json`` (the latest, replaced
  atomically) and ``checkpoints.jsonl`` (every checkpoint, appended), which an operator ships
  off the host, since a checkpoint only detects truncation from where the store's attacker
  cannot reach it;
- hooks: callables given each `Checkpoint`; with metrics on, the server adds
  `sandbox.telemetry.metrics.audit_checkpoint`, which sets the gauges
  ``ptc_audit_checkpoint_tree_size{tenant}`` and ``ptc_audit_checkpoint_timestamp_seconds``;
  refusal hooks are given the tenant of each refusal, which with metrics on counts
  ``ptc_audit_checkpoint_refusals_total{tenant}`` (the alert: the store lost what a checkpoint
  covers).

Cost: what was appended since the last checkpoint. A round reads every tenant's chain head in
one statement, and nothing more for a tenant whose head did not move; for one that grew, the
entry hashes after the last covered one (a primary-key range) and, after a restart, the
frontier row at the last checkpoint's size, trusted only when its root is the signed root.
Only a publisher with no usable frontier (its first checkpoint of a tenant, or a store without
the row) builds the tree from the first entry, once, with a consistency proof against its last
checkpoint. The price: a running publisher no longer re-reads entries its last checkpoint
covered, so an edit or deletion among them is found by `ptc audit verify` (the chain) and
`verify --checkpoint` (the consistency proof), not by the next round. In a fleet
sharing one PostgreSQL store, every instance that is given a key publishes its own checkpoints
(``origin`` names the instance); they describe the same chains, so any of them verifies.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sandbox.audit._sqlcore import SqlAuditStore
from sandbox.audit.checkpoints import Checkpoint, sign_checkpoint, tenant_tree
from sandbox.audit.frontier import Frontier
from sandbox.audit.merkle import consistency_proof, verify_consistency
from sandbox.errors import StoreUnavailable

__all__ = ["CheckpointPublisher", "checkpoint_file_name"]

log = logging.getLogger(__name__)
HISTORY_FILE = "checkpoints.jsonl"
_SAFE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

Hook = Callable[[Checkpoint], None]
RefusalHook = Callable[[str], None]  # the tenant whose tree could not be signed


def checkpoint_file_name(tenant: str) -> str:
    """``<tenant>.checkpoint.json``; a tenant id unsafe as a file name is spelled by its hash."""
    if _SAFE.fullmatch(tenant) and tenant not in (".", ".."):
        return f"{tenant}.checkpoint.json"
    return f"tenant-{hashlib.sha256(tenant.encode('utf-8')).hexdigest()[:16]}.checkpoint.json"


class CheckpointPublisher:
    def __init__(
        self,
        store: SqlAuditStore,
        key: Ed25519PrivateKey,
        *,
        directory: str | os.PathLike[str] | None = None,
        origin: str | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.directory = Path(directory) if directory is not None else None
        self.origin = origin or store.instance
        self.hooks: list[Hook] = []
        self.refusal_hooks: list[RefusalHook] = []
        self.published = 0
        self.refused = 0  # trees that did not extend the last checkpoint
        self._last: dict[str, Checkpoint] = {}
        self._frontiers: dict[str, Frontier] = {}  # the tree's right edge at `_last`'s size
        # One round at a time: a round cancelled at shutdown goes on in its thread, and the
        # final round (then the store's close) must wait for it.
        self._round = threading.Lock()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def add_hook(self, hook: Hook) -> None:
        self.hooks.append(hook)

    def add_refusal_hook(self, hook: RefusalHook) -> None:
        """``hook(tenant)`` for each round that refused to sign the tenant's tree: the store
        lost entries a checkpoint covers (or has a gap), the one event worth an alert."""
        self.refusal_hooks.append(hook)

    def _refuse(self, tenant: str, message: str, *args: object) -> None:
        self.refused += 1
        log.error(message, tenant, *args)
        for hook in self.refusal_hooks:
            try:
                hook(tenant)
            except Exception:  # a hook must not stop the other tenants' checkpoints
                log.exception("audit checkpoint: a refusal hook failed")

    def latest(self, tenant: str) -> Checkpoint | None:
        """The last checkpoint published for the tenant (also by an earlier run, from its file)."""
        if tenant not in self._last and self.directory is not None:
            path = self.directory / checkpoint_file_name(tenant)
            if path.exists():
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                    self._last[tenant] = Checkpoint.from_json(data, str(path))
                except Exception as exc:  # an unreadable file must not stop us
                    log.warning("audit checkpoint: ignoring %s: %s", path, exc)
        return self._last.get(tenant)

    def publish_once(self, now: float | None = None) -> list[Checkpoint]:
        """Signs and publishes a checkpoint for every tenant whose tree changed."""
        with self._round:
            return self._publish_changed(now)

    def _publish_changed(self, now: float | None) -> list[Checkpoint]:
        signed: list[Checkpoint] = []
        for tenant, head in sorted(self.store.heads().items()):
            last = self.latest(tenant)
            if last is not None and last.tree_size == head:
                continue  # nothing appended: nothing read, nothing signed
            if last is not None and head < last.tree_size:
                self._refuse(
                    tenant,
                    "audit checkpoint: tenant %s: the store's tree (size %d) does not extend the "
                    "checkpoint at size %d: entries were removed or rewritten; not signing",
                    head,
                    last.tree_size,
                )
                continue
            frontier = self._grow(tenant, last)
            if frontier is None or (last is not None and frontier.size == last.tree_size):
                continue
            checkpoint = sign_checkpoint(
                self.key, tenant, frontier.size, frontier.root(), self.origin, now
            )
            self._publish(checkpoint)
            self._frontiers[tenant] = frontier
            try:
                self.store.save_frontier(tenant, frontier)
            except StoreUnavailable as exc:  # the next checkpoint starts from memory
                log.warning("audit checkpoint: tenant %s: frontier not saved: %s", tenant, exc)
            signed.append(checkpoint)
        return signed

    def _grow(self, tenant: str, last: Checkpoint | None) -> Frontier | None:
        """The tenant's tree now, grown from the last checkpoint's frontier by the entries
        appended since; None when it was refused (reported)."""
        base = self._base(tenant, last)
        if base is None:
            return None
        # From the last covered entry on: it must still be the one the checkpoint covers.
        hashes = self.store.hashes_after(tenant, max(base.size - 1, 0))
        if base.size:
            if not hashes or hashes[0] != (base.size, base.last_hash):
                self._refuse(
                    tenant,
                    "audit checkpoint: tenant %s: the store's tree (size %d) does not extend the "
                    "checkpoint at size %d: entries were removed or rewritten; not signing",
                    hashes[-1][0] if hashes else base.size - 1,
                    base.size,
                )
                return None
            hashes = hashes[1:]
        for offset, (seq, _) in enumerate(hashes):
            if seq != base.size + offset + 1:
                self._refuse(
                    tenant,
                    "audit checkpoint: tenant %s: entry %d is missing from the chain: deleted; "
                    "not signing",
                    base.size + offset + 1,
                )
                return None
        return base.extend(digest for _, digest in hashes)

    def _base(self, tenant: str, last: Checkpoint | None) -> Frontier | None:
        """The frontier the last checkpoint signed: this publisher's own, or the store's row
        at that size when its root is the signed root (a restart); else the whole tree is
        rebuilt once and checked against the checkpoint (a consistency proof)."""
        if last is None:
            return Frontier.empty()
        for found in (
            self._frontiers.get(tenant),
            self.store.frontier_at(tenant, last.tree_size),
        ):
            if (
                found is not None
                and found.size == last.tree_size
                and found.root() == last.root_hash
                and found.proves_last()
            ):
                return found
        tree = tenant_tree(self.store.chain_hashes(tenant), tenant)
        if tree.gap_after is not None:
            self._refuse(
                tenant,
                "audit checkpoint: tenant %s: entry %d is missing from the chain: deleted; "
                "not signing",
                tree.gap_after + 1,
            )
            return None
        if not (
            last.tree_size <= tree.size
            and verify_consistency(
                last.tree_size,
                tree.size,
                last.root_hash,
                tree.root(),
                consistency_proof(tree.leaves, last.tree_size),
            )
        ):
            self._refuse(
                tenant,
                "audit checkpoint: tenant %s: the store's tree (size %d) does not extend the "
                "checkpoint at size %d: entries were removed or rewritten; not signing",
                tree.size,
                last.tree_size,
            )
            return None
        hashes = self.store.chain_hashes(tenant)[: last.tree_size]
        return Frontier.empty().extend(digest for _, digest in hashes)

    def _publish(self, checkpoint: Checkpoint) -> None:
        self._last[checkpoint.tenant] = checkpoint
        self.published += 1
        line = json.dumps(checkpoint.to_json(), sort_keys=True)
        if self.directory is not None:
            path = self.directory / checkpoint_file_name(checkpoint.tenant)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(line + "\n", encoding="utf-8")
            os.replace(tmp, path)
            with open(self.directory / HISTORY_FILE, "a", encoding="utf-8") as history:
                history.write(line + "\n")
        log.info(
            "audit checkpoint: tenant=%s tree_size=%d root=sha256:%s key=%s",
            checkpoint.tenant,
            checkpoint.tree_size,
            checkpoint.root_hash.hex(),
            checkpoint.key_id,
        )
        for hook in self.hooks:
            try:
                hook(checkpoint)
            except Exception:  # a metrics hook must not stop publication
                log.exception("audit checkpoint: hook %r failed", hook)

    async def run(self, interval_s: float) -> None:
        """Publishes now and then every ``interval_s`` seconds until cancelled."""
        while True:
            try:
                await asyncio.to_thread(self.publish_once)
            except Exception:  # logged; the next round retries
                log.exception("audit checkpoint: publishing failed")
            await asyncio.sleep(interval_s)
