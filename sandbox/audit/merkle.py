"""The Merkle tree over a tenant's audit chain, hashed as certificate-transparency logs hash theirs.

RFC 6962 section 2.1 (restated in RFC 9162 section 2.1), SHA-256 throughout:

- the hash of an empty tree is ``SHA-256()``;
- a leaf hashes as ``SHA-256(0x00 || leaf)``, an inner node as ``SHA-256(0x01 || left || right)``
  (the prefixes keep a leaf from passing for an inner node);
- a tree of ``n > 1`` leaves splits at ``k``, the largest power of two smaller than ``n``: the
  left subtree holds the first ``k`` leaves, the right one the rest, each hashed the same way.

A *consistency proof* between sizes ``m <= n`` is the list of node hashes (RFC 6962 section
2.1.2, ``PROOF(m, D[n])``) from which a verifier holding only the two roots can check that the
first ``m`` leaves of the larger tree are exactly the smaller tree; `verify_consistency` is the
verification algorithm of RFC 9162 section 2.1.4.2. Together with a signed checkpoint of an
earlier size it shows that nothing the checkpoint covers was removed, edited or reordered since.

Written here rather than taken from a library: the Python packages that exist either hash
differently (no domain-separation prefixes, or duplicated odd leaves as Bitcoin does), or, like
``pymerkle``, own the leaves' storage and their proof serialisation, while the leaves here are the
entry hashes already stored in the audit database and the proofs must be the RFC's plain lists
of hashes. The whole of it is the three recursions and one loop of the RFCs, and the tests check
every proof of every pair of sizes up to 64 leaves, plus random larger ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = [
    "EMPTY_ROOT",
    "consistency_proof",
    "leaf_hash",
    "node_hash",
    "root",
    "verify_consistency",
]

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves (`leaf_hash` of each entry), in O(n) time, O(log n) space.

    Folds perfect subtrees left to right (a stack of at most log2(n) roots), then joins what is
    left from the right, which is exactly the RFC's split at the largest power of two.
    """
    if not leaves:
        return EMPTY_ROOT
    stack: list[tuple[int, bytes]] = []  # (leaf count, hash) of perfect subtrees
    for leaf in leaves:
        size, digest = 1, leaf
        while stack and stack[-1][0] == size:
            left = stack.pop()[1]
            size, digest = size * 2, node_hash(left, digest)
        stack.append((size, digest))
    digest = stack.pop()[1]
    while stack:
        digest = node_hash(stack.pop()[1], digest)
    return digest


def consistency_proof(leaves: Sequence[bytes], m: int) -> list[bytes]:
    """``PROOF(m, D[n])`` over the hashed leaves ``D[n]``; empty when ``m`` is 0 or ``n``."""
    n = len(leaves)
    if not 0 <= m <= n:
        raise ValueError(f"consistency proof from size {m} in a tree of {n} leaves")
    if m in (0, n):
        return []
    return _subproof(leaves, m, complete=True)


def _subproof(leaves: Sequence[bytes], m: int, complete: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if complete else [root(leaves)]
    k = _split(n)
    if m <= k:
        return [*_subproof(leaves[:k], m, complete), root(leaves[k:])]
    return [*_subproof(leaves[k:], m - k, complete=False), root(leaves[:k])]


def verify_consistency(
    m: int, n: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """True when ``proof`` shows the tree of size ``m`` and root ``old_root`` is a prefix of
    the tree of size ``n`` and root ``new_root`` (RFC 9162 section 2.1.4.2)."""
    if m < 0 or n < m:
        return False
    if m == 0:
        return not proof
    if m == n:
        return not proof and old_root == new_root
    if not proof:
        return False
    path = list(proof)
    if m & (m - 1) == 0:  # m is a power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    fn, sn = m - 1, n - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == new_root
