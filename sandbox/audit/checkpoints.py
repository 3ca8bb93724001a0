"""Signed audit checkpoints: an anchor outside the store that makes truncation detectable.

The hash chain (`sandbox.audit._verify`) detects an edited, deleted or reordered entry, but not
the removal of a tenant's newest entries together with its head row: what is left is a valid,
shorter chain. A *checkpoint* is a statement signed with the operator's Ed25519 key, in the style
of a certificate-transparency signed tree head::

    {"format": "ptc-audit-checkpoint/v1", "origin": "ptc-1", "tenant": "acme",
     "tree_size": 1200, "root_hash": "sha256:<hex>", "timestamp_ms": 1764558000000,
     "key_id": "ed25519:<16 hex>", "signature": "<base64>"}

``tree_size`` and ``root_hash`` describe the Merkle tree (`sandbox.audit.merkle`, RFC 6962
hashing) whose leaves are the tenant's entry hashes in sequence order, pruned ones included.
The signature covers ``ptc-audit-checkpoint/v1`` and a newline followed by the canonical JSON of
every other field, so no field (the key id included) can change without breaking it.

`verify_checkpoint` checks the signature against the operator's public keys (picked by
``key_id``), then builds the store's current tree and checks a consistency proof from the
checkpoint's size to it: a store that lost entries the checkpoint covers (its newest ones, the
head with them, or any other) cannot produce one. Keys rotate by adding a new key: each key's id
is derived from its public key, so checkpoints signed with an old key verify as long as its
public key is among those given.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sandbox.audit._codec import canonical
from sandbox.audit.merkle import consistency_proof, leaf_hash, root, verify_consistency
from sandbox.errors import InvalidArgument

__all__ = [
    "FORMAT",
    "KEY_ENV",
    "PUBLIC_KEYS_ENV",
    "Checkpoint",
    "TenantTree",
    "check_signature",
    "describe",
    "generate_key",
    "key_id",
    "load_private_key",
    "load_public_keys",
    "read_checkpoints",
    "sign_checkpoint",
    "tenant_tree",
    "verify_checkpoint",
]

FORMAT = "ptc-audit-checkpoint/v1"
KEY_ENV = "PTC_CHECKPOINT_KEY"  # the signing key's PEM text (e.g. from a Kubernetes Secret)
PUBLIC_KEYS_ENV = "PTC_CHECKPOINT_PUBLIC_KEYS"  # one or more public-key PEM blocks
_FIELDS = ("format", "origin", "tenant", "tree_size", "root_hash", "timestamp_ms", "key_id")


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    tenant: str
    tree_size: int
    root_hash: bytes
    timestamp_ms: int
    key_id: str
    signature: bytes

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "origin": self.origin,
            "tenant": self.tenant,
            "tree_size": self.tree_size,
            "root_hash": "sha256:" + self.root_hash.hex(),
            "timestamp_ms": self.timestamp_ms,
            "key_id": self.key_id,
        }

    def signed_message(self) -> bytes:
        return _message(self.body())

    def to_json(self) -> dict[str, Any]:
        return {**self.body(), "signature": base64.b64encode(self.signature).decode("ascii")}

    @classmethod
    def from_json(cls, data: object, where: str) -> Checkpoint:
        """Parses one checkpoint, naming ``where`` and the field at fault on any error."""
        if not isinstance(data, dict):
            raise InvalidArgument(f"{where}: a checkpoint must be a JSON object")
        unknown = sorted(set(data) - {*_FIELDS, "signature"})
        if unknown:
            raise InvalidArgument(f"{where}: unknown field {unknown[0]!r}")
        if data.get("format") != FORMAT:
            raise InvalidArgument(f"{where}: format must be {FORMAT!r}, not {data.get('format')!r}")
        for name in ("origin", "tenant", "root_hash", "key_id", "signature"):
            if not isinstance(data.get(name), str):
                raise InvalidArgument(f"{where}: {name} must be a string")
        for name in ("tree_size", "timestamp_ms"):
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgument(f"{where}: {name} must be a non-negative integer")
        digest = data["root_hash"]
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise InvalidArgument(
                f"{where}: root_hash must be 'sha256:' and 64 lowercase hex digits"
            )
        try:
            signature = base64.b64decode(data["signature"], validate=True)
        except (ValueError, binascii.Error):
            raise InvalidArgument(f"{where}: signature is not base64") from None
        root_hash = bytes.fromhex(digest.removeprefix("sha256:"))
        return cls(
            origin=data["origin"],
            tenant=data["tenant"],
            tree_size=data["tree_size"],
            root_hash=root_hash,
            timestamp_ms=data["timestamp_ms"],
            key_id=data["key_id"],
            signature=signature,
        )


def _message(body: Mapping[str, Any]) -> bytes:
    return (FORMAT + "\n" + canonical(dict(body))).encode("utf-8")


# -- keys ------------------------------------------------------------------------------------


def key_id(public_key: Ed25519PublicKey) -> str:
    """``ed25519:`` and the first 16 hex digits of SHA-256 of the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def generate_key(path: str | os.PathLike[str]) -> str:
    """Writes a new private key (PKCS#8 PEM, mode 0600) at ``path`` and its public key at
    ``path.pub``; returns the key id."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    target = os.fspath(path)
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        raise InvalidArgument(f"{target} exists: refusing to overwrite a key") from None
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    Path(target + ".pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_id(key.public_key())


def load_private_key(path: str | None = None) -> Ed25519PrivateKey:
    """The signing key from a PEM file, or else from ``$PTC_CHECKPOINT_KEY`` (its PEM text)."""
    if path:
        where = path
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"checkpoint key {path}: {exc.strerror}") from exc
    else:
        where = f"${KEY_ENV}"
        text = os.environ.get(KEY_ENV, "")
        if not text:
            raise InvalidArgument(f"no checkpoint key: pass a key file or set ${KEY_ENV}")
        data = text.encode("utf-8")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"checkpoint key {where}: not an unencrypted PEM key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidArgument(f"checkpoint key {where}: not an Ed25519 key")
    return key


def _pem_blocks(data: bytes) -> list[bytes]:
    return re.findall(rb"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", data, re.DOTALL)


def load_public_keys(paths: Sequence[str] = ()) -> dict[str, Ed25519PublicKey]:
    """Public keys by id from PEM files (each may hold several keys) and
    ``$PTC_CHECKPOINT_PUBLIC_KEYS``; old keys stay in the set after a rotation."""
    sources: list[tuple[str, bytes]] = []
    for path in paths:
        try:
            sources.append((path, Path(path).read_bytes()))
        except OSError as exc:
            raise InvalidArgument(f"public key {path}: {exc.strerror}") from exc
    if os.environ.get(PUBLIC_KEYS_ENV):
        sources.append((f"${PUBLIC_KEYS_ENV}", os.environ[PUBLIC_KEYS_ENV].encode("utf-8")))
    keys: dict[str, Ed25519PublicKey] = {}
    for where, data in sources:
        blocks = _pem_blocks(data)
        if not blocks:
            raise InvalidArgument(f"public key {where}: no PEM public key in it")
        for block in blocks:
            try:
                key = serialization.load_pem_public_key(block)
            except ValueError as exc:
                raise InvalidArgument(f"public key {where}: not a PEM public key") from exc
            if not isinstance(key, Ed25519PublicKey):
                raise InvalidArgument(f"public key {where}: not an Ed25519 key")
            keys[key_id(key)] = key
    if not keys:
        raise InvalidArgument(
            f"no public key to check checkpoints with: pass --public-key or set ${PUBLIC_KEYS_ENV}"
        )
    return keys


# -- signing and reading ---------------------------------------------------------------------


def sign_checkpoint(
    key: Ed25519PrivateKey,
    tenant: str,
    tree_size: int,
    root_hash: bytes,
    origin: str,
    now: float | None = None,
) -> Checkpoint:
    unsigned = Checkpoint(
        origin=origin,
        tenant=tenant,
        tree_size=tree_size,
        root_hash=root_hash,
        timestamp_ms=int((time.time() if now is None else now) * 1000),
        key_id=key_id(key.public_key()),
        signature=b"",
    )
    signature = key.sign(unsigned.signed_message())
    return Checkpoint(**{**unsigned.__dict__, "signature": signature})


def read_checkpoints(path: str) -> list[Checkpoint]:
    """The checkpoints in a file: one JSON object, or JSON lines (the published history)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"checkpoint {path}: {exc}") from exc
    try:
        return [Checkpoint.from_json(json.loads(text), f"checkpoint {path}")]
    except ValueError:
        pass  # not one JSON document: JSON lines
    found: list[Checkpoint] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"checkpoint {path}, line {number}"
        try:
            data = json.loads(line)
        except ValueError:
            raise InvalidArgument(f"{where}: not JSON") from None
        found.append(Checkpoint.from_json(data, where))
    if not found:
        raise InvalidArgument(f"checkpoint {path}: no checkpoint in the file")
    return found


# -- the store's tree and verification -------------------------------------------------------


@dataclass(frozen=True)
class TenantTree:
    """The tenant's Merkle leaves as the store holds them now."""

    tenant: str
    leaves: list[bytes]  # leaf hashes of entries 1..len(leaves), contiguous
    gap_after: int | None  # the last contiguous sequence number when entries after it skip

    @property
    def size(self) -> int:
        return len(self.leaves)

    def root(self) -> bytes:
        return root(self.leaves)


def tenant_tree(hashes: Iterable[tuple[int, str]], tenant: str) -> TenantTree:
    """Leaves from the store's (seq, entry hash) pairs; stops at the first missing number."""
    leaves: list[bytes] = []
    gap: int | None = None
    for seq, digest in hashes:
        if seq != len(leaves) + 1:
            gap = len(leaves)
            break
        leaves.append(leaf_hash(digest.encode("utf-8")))
    return TenantTree(tenant, leaves, gap)


def describe(checkpoint: Checkpoint) -> str:
    return (
        f"checkpoint of tenant {checkpoint.tenant} at size {checkpoint.tree_size} "
        f"(key {checkpoint.key_id})"
    )


def check_signature(checkpoint: Checkpoint, keys: Mapping[str, Ed25519PublicKey]) -> list[str]:
    """Problems with the checkpoint's signature; empty when one of ``keys`` signed it."""
    where = describe(checkpoint)
    key = keys.get(checkpoint.key_id)
    if key is None:
        known = ", ".join(sorted(keys))
        return [f"{where}: signed by a key that is not among the public keys given ({known})"]
    try:
        key.verify(checkpoint.signature, checkpoint.signed_message())
    except InvalidSignature:
        return [f"{where}: the signature does not verify: forged or altered checkpoint"]
    return []


def verify_checkpoint(
    checkpoint: Checkpoint, keys: Mapping[str, Ed25519PublicKey], tree: TenantTree
) -> list[str]:
    """Problems with one checkpoint against the store's current tree; empty when it holds."""
    where = describe(checkpoint)
    unsigned = check_signature(checkpoint, keys)
    if unsigned:
        return unsigned
    m, n = checkpoint.tree_size, tree.size
    if m > n:
        why = (
            f"entry {tree.gap_after + 1} is missing"
            if tree.gap_after is not None
            else f"its chain ends at entry {n}"
        )
        return [
            f"{where}: the store holds only {n} entries of tenant {checkpoint.tenant} ({why}): "
            f"entries {n + 1}..{m} that the checkpoint covers were removed: truncated"
        ]
    new_root = tree.root()
    proof = consistency_proof(tree.leaves, m)
    if not verify_consistency(m, n, checkpoint.root_hash, new_root, proof):
        return [
            f"{where}: the store's tree of size {n} is not consistent with the checkpoint "
            f"(consistency proof from {m} to {n} fails): entries 1..{m} were edited, replaced "
            "or reordered"
        ]
    return []
