"""The checkpoint parts of ``ptc audit``: ``keygen``, ``checkpoint``, ``verify --checkpoint``.

    ptc audit keygen /etc/ptc/checkpoint.key          # writes the key and checkpoint.key.pub
    ptc audit checkpoint --db URL --key FILE --dir D  # signs one checkpoint per tenant now
    ptc audit verify --db URL --checkpoint D/acme.checkpoint.json --public-key FILE.pub

``verify --since-checkpoint FILE`` verifies each tenant from the latest checkpoint of it in FILE
instead of from its first entry: the checkpoint's signature, then the store's Merkle frontier at
its size (`sandbox.audit.frontier`: its root must be the signed root, and it proves the hash of
the checkpoint's last entry), then the chain after that entry, linked to it.

``verify --checkpoint FILE`` (repeatable; a file may hold one checkpoint or JSON lines, like the
published ``checkpoints.jsonl``) checks each checkpoint's signature against the public keys
(``--public-key``, repeatable, and ``$PTC_CHECKPOINT_PUBLIC_KEYS``), then a consistency proof from
its tree size to the store's current tree, and exits 1 naming each checkpoint that does not hold.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from sandbox.audit import SqlAuditStore, VerifyReport
from sandbox.audit.checkpoints import (
    KEY_ENV,
    Checkpoint,
    TenantTree,
    check_signature,
    describe,
    generate_key,
    load_private_key,
    load_public_keys,
    read_checkpoints,
    tenant_tree,
    verify_checkpoint,
)
from sandbox.audit.merkle import consistency_proof
from sandbox.commands._audit_store import open_named_store

__all__ = ["CheckpointReport"]


@dataclass
class CheckpointReport:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _checkpoint_args(verify: argparse.ArgumentParser, sub: argparse._SubParsersAction[Any]) -> None:
    verify.add_argument(
        "--since-checkpoint",
        metavar="FILE",
        help="start each tenant's verification after the latest signed checkpoint of it in FILE "
        "(its signature and the store's tree frontier at its size checked first): costs what "
        "was appended since",
    )
    verify.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="FILE",
        help="also prove the store holds everything this signed checkpoint covers (repeatable)",
    )
    verify.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="PEM",
        help="public key(s) checkpoints may be signed with (repeatable; old keys too)",
    )
    keygen = sub.add_parser("keygen", help="write a new Ed25519 checkpoint key and its .pub")
    keygen.add_argument("path", metavar="FILE", help="private key file to create (mode 0600)")
    keygen.set_defaults(handler=_keygen)
    sign = sub.add_parser("checkpoint", help="sign and publish a checkpoint per tenant now")
    sign.add_argument(
        "--db",
        default=os.environ.get("PTC_AUDIT_DB"),
        help="SQLite file or postgresql:// URL (default: $PTC_AUDIT_DB)",
    )
    sign.add_argument("--key", metavar="PEM", help=f"signing key (default: ${KEY_ENV})")
    sign.add_argument("--dir", required=True, metavar="DIR", help="where to write checkpoints")
    sign.add_argument("--origin", help="name of the signer in the checkpoint (default: host)")
    sign.set_defaults(handler=_sign)


def _verify_checkpoints(store: SqlAuditStore, args: argparse.Namespace) -> CheckpointReport:
    report = CheckpointReport()
    if not args.checkpoint:
        return report
    checkpoints = [c for path in args.checkpoint for c in read_checkpoints(path)]
    keys = load_public_keys(args.public_key)
    trees: dict[str, TenantTree] = {}
    for checkpoint in checkpoints:
        tenant = checkpoint.tenant
        if tenant not in trees:
            trees[tenant] = tenant_tree(store.chain_hashes(tenant), tenant)
        tree = trees[tenant]
        problems = verify_checkpoint(checkpoint, keys, tree)
        report.problems += problems
        if not problems:
            proof = consistency_proof(tree.leaves, checkpoint.tree_size)
            report.lines.append(
                f"checkpoint ok: tenant {tenant} at size {checkpoint.tree_size} "
                f"(key {checkpoint.key_id}) is consistent with the store's tree of size "
                f"{tree.size} (proof of {len(proof)} hashes)"
            )
    return report


def _verify_since(
    store: SqlAuditStore, args: argparse.Namespace
) -> tuple[VerifyReport, CheckpointReport]:
    """``verify --since-checkpoint FILE``: each tenant from the latest checkpoint of it in FILE
    whose signature holds, the tenants without one from their first entry."""
    checked = CheckpointReport()
    keys = load_public_keys(args.public_key)
    latest: dict[str, Checkpoint] = {}
    for checkpoint in read_checkpoints(args.since_checkpoint):
        unsigned = check_signature(checkpoint, keys)
        checked.problems += unsigned
        known = latest.get(checkpoint.tenant)
        if not unsigned and (known is None or checkpoint.tree_size > known.tree_size):
            latest[checkpoint.tenant] = checkpoint
    total, problems = 0, list[str]()
    for tenant in [args.tenant] if args.tenant else store.tenants():
        since = None
        anchor = latest.get(tenant)
        if anchor is not None and anchor.tree_size > 0:
            frontier = store.frontier_at(tenant, anchor.tree_size)
            if (
                frontier is None
                or frontier.root() != anchor.root_hash
                or not frontier.proves_last()
            ):
                checked.problems.append(
                    f"{describe(anchor)}: the store holds no tree frontier at that size with "
                    "the checkpoint's root (edited, or never written by a publisher); verify "
                    "without --since-checkpoint"
                )
                continue
            since = (anchor.tree_size, frontier.last_hash)
            checked.lines.append(
                f"since checkpoint: tenant {tenant} from entry {anchor.tree_size + 1} "
                f"(key {anchor.key_id})"
            )
        report = store.verify(tenant, since)
        total += report.records
        problems += report.problems
    return VerifyReport(tenant=args.tenant, records=total, problems=problems), checked


def _keygen(args: argparse.Namespace) -> int:
    key_id = generate_key(args.path)
    print(f"{key_id}: private key {args.path}, public key {args.path}.pub")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from sandbox.audit.publisher import CheckpointPublisher

    key = load_private_key(args.key)
    store = open_named_store(args)
    try:
        publisher = CheckpointPublisher(store, key, directory=args.dir, origin=args.origin)
        for checkpoint in publisher.publish_once():
            print(
                f"{checkpoint.tenant}: tree_size={checkpoint.tree_size} "
                f"root=sha256:{checkpoint.root_hash.hex()} key={checkpoint.key_id}"
            )
    finally:
        store.close()
    return 1 if publisher.refused else 0
