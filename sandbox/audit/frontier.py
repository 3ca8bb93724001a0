"""The right edge of a tenant's Merkle tree: what a checkpoint needs to grow the tree incrementally.

A tree of ``n`` leaves (RFC 6962 hashing, `sandbox.audit.merkle`) is a row of perfect subtrees,
one per set bit of ``n``, largest first; their roots, folded from the right, are the tree's
root. That row (at most 64 hashes) is the *frontier*: appending leaves needs nothing else, so a
checkpoint costs what was appended since the last one instead of rebuilding from the first
entry (4.7 s for a tenant of a million executions, every interval, changed or not).

The frontier also keeps the hash of its last entry and that leaf's path inside the last perfect
subtree (the left siblings, bottom up). With them a verifier holding a signed checkpoint of size
``n`` checks, in O(log n), that the store's frontier row is the tree the checkpoint signed (its
root is the signed root) and that entry ``n`` is the one the checkpoint covers (its leaf and
path give the last subtree's root); `ptc audit verify --since-checkpoint` then verifies the
chain from entry ``n + 1`` on, linked to that hash. A frontier read from the store is never
trusted until its root matches a signed checkpoint: an edited row cannot match one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.audit.merkle import EMPTY_ROOT, leaf_hash, node_hash

__all__ = ["Frontier"]


@dataclass(frozen=True)
class Frontier:
    size: int
    nodes: tuple[bytes, ...]  # roots of the perfect subtrees, largest (leftmost) first
    last_hash: str = ""  # the entry hash of leaf `size` ("" for an empty tree)
    last_path: tuple[bytes, ...] = ()  # its left siblings in the last subtree, bottom up

    @classmethod
    def empty(cls) -> Frontier:
        return cls(0, ())

    def root(self) -> bytes:
        if not self.nodes:
            return EMPTY_ROOT
        digest = self.nodes[-1]
        for left in reversed(self.nodes[:-1]):
            digest = node_hash(left, digest)
        return digest

    def extend(self, hashes: Iterable[str]) -> Frontier:
        """The frontier after appending entries with these hashes (in sequence order)."""
        sizes = _sizes(self.size)
        stack = list(zip(sizes, self.nodes, strict=True))
        size, last_hash, last_path = self.size, self.last_hash, self.last_path
        for text in hashes:
            count, digest, path = 1, leaf_hash(text.encode("utf-8")), []
            while stack and stack[-1][0] == count:
                left = stack.pop()[1]
                path.append(left)
                count, digest = count * 2, node_hash(left, digest)
            stack.append((count, digest))
            size, last_hash, last_path = size + 1, text, tuple(path)
        return Frontier(size, tuple(d for _, d in stack), last_hash, last_path)

    def proves_last(self) -> bool:
        """Whether ``last_hash`` and ``last_path`` give the last subtree's root: then entry
        `size` is the one the frontier (and a checkpoint whose root is its root) covers."""
        if not self.nodes:
            return self.size == 0
        if len(self.nodes) != self.size.bit_count() or len(self.last_path) != _low_bit(self.size):
            return False
        digest = leaf_hash(self.last_hash.encode("utf-8"))
        for left in self.last_path:
            digest = node_hash(left, digest)
        return digest == self.nodes[-1]

    def to_row(self) -> tuple[str, str, str]:
        """(nodes, last hash, last path) as stored: hex hashes joined by commas."""
        return (
            ",".join(n.hex() for n in self.nodes),
            self.last_hash,
            ",".join(n.hex() for n in self.last_path),
        )

    @classmethod
    def from_row(cls, size: int, nodes: str, last_hash: str, last_path: str) -> Frontier:
        """A stored row; raises ValueError when it is not hex hashes."""

        def split(text: str) -> tuple[bytes, ...]:
            return tuple(bytes.fromhex(part) for part in text.split(",")) if text else ()

        return cls(size, split(nodes), last_hash, split(last_path))


def _sizes(n: int) -> list[int]:
    """The leaf counts of the perfect subtrees of a tree of ``n`` leaves, largest first."""
    return [1 << bit for bit in range(n.bit_length() - 1, -1, -1) if n >> bit & 1]


def _low_bit(n: int) -> int:
    """log2 of the last perfect subtree's size: the length of the last leaf's path in it."""
    return (n & -n).bit_length() - 1
