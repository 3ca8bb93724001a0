"""The Merkle tree of `sandbox.audit.merkle` against RFC 6962's reference roots, and its
consistency proofs for every pair of sizes up to 64 leaves and for random larger trees."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from sandbox.audit.merkle import (
    EMPTY_ROOT,
    consistency_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
)

# The leaves and roots of the reference test vectors used by certificate-transparency
# implementations (RFC 6962 hashing of these eight inputs).
LEAVES = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
]
ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def _leaves(n: int, salt: bytes = b"") -> list[bytes]:
    return [leaf_hash(salt + i.to_bytes(4, "big")) for i in range(n)]


def _reference_root(leaves: list[bytes]) -> bytes:
    """MTH written as the RFC's recursion, to hold the iterative `root` to."""
    if not leaves:
        return EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


@pytest.mark.parametrize("size", range(1, 9))
def test_roots_match_the_rfc_6962_reference_vectors(size: int) -> None:
    leaves = [leaf_hash(bytes.fromhex(d)) for d in LEAVES[:size]]
    assert root(leaves).hex() == ROOTS[size - 1]


def test_empty_tree_root_is_the_hash_of_nothing() -> None:
    assert root([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_every_proof_of_every_pair_of_sizes_up_to_64_verifies_and_detects_edits() -> None:
    for n in range(0, 65):
        leaves = _leaves(n)
        assert root(leaves) == _reference_root(leaves)
        for m in range(0, n + 1):
            proof = consistency_proof(leaves, m)
            assert verify_consistency(m, n, root(leaves[:m]), root(leaves), proof), (m, n)
            if 0 < m < n:
                edited = list(leaves)
                edited[m - 1] = leaf_hash(b"edited")
                # The old tree had another last leaf: the proof from the real tree fails.
                assert not verify_consistency(m, n, root(edited[:m]), root(leaves), proof)
                # A claimed larger old tree than the proof was made for fails.
                assert not verify_consistency(m + 1, n, root(leaves[: m + 1]), root(leaves), proof)


def test_consistency_proof_sizes_are_logarithmic() -> None:
    leaves = _leaves(1000)
    assert len(consistency_proof(leaves, 1)) == 10
    assert len(consistency_proof(leaves, 512)) == 1
    assert max(len(consistency_proof(leaves, m)) for m in range(1, 1000)) <= 20


def test_out_of_range_sizes() -> None:
    with pytest.raises(ValueError, match="from size 5 in a tree of 4 leaves"):
        consistency_proof(_leaves(4), 5)
    assert not verify_consistency(5, 4, EMPTY_ROOT, EMPTY_ROOT, [])
    assert not verify_consistency(2, 4, EMPTY_ROOT, EMPTY_ROOT, [])  # empty proof for m < n


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=3000),
    data=st.data(),
)
def test_random_sizes_prove_prefixes_and_refuse_truncated_or_rewritten_trees(
    n: int, data: st.DataObject
) -> None:
    leaves = _leaves(n)
    m = data.draw(st.integers(min_value=1, max_value=n - 1), label="m")
    old_root = root(leaves[:m])
    proof = consistency_proof(leaves, m)
    assert verify_consistency(m, n, old_root, root(leaves), proof)
    # Truncated and regrown: the newest old leaves replaced by others, the tree as large again.
    cut = data.draw(st.integers(min_value=0, max_value=m - 1), label="cut")
    regrown = leaves[:cut] + _leaves(n - cut, salt=b"forged")
    assert not verify_consistency(m, n, old_root, root(regrown), consistency_proof(regrown, m)), (
        m,
        n,
        cut,
    )
    # The old root presented with a proof for another size fails too.
    other = data.draw(st.integers(min_value=1, max_value=n - 1), label="other")
    if other != m:
        assert not verify_consistency(
            m, n, old_root, root(leaves), consistency_proof(leaves, other)
        )
