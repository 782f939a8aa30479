"""The answer log's Merkle tree, exactly as RFC 6962 / RFC 9162 define it.

Pure functions over leaf hashes.  A leaf's hash is SHA-256(0x00 || leaf), an
inner node's SHA-256(0x01 || left || right); the tree of n > 1 leaves splits
at k, the largest power of two below n (RFC 9162 section 2.1.1).  Proofs are
lists of 32-byte hashes; the verifiers follow RFC 9162 sections 2.1.3.2 and
2.1.4.2 step by step, so a proof that any other conforming log would refuse
is refused here too.

No Merkle library on the index implements RFC 6962 exactly and is kept up;
this is small enough to read against the RFC, and the published test vectors
check it (tests/unit/test_merkle.py).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(ValueError):
    """A proof that does not hold, or asked of a tree that cannot give it."""


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(hashes: Sequence[bytes]) -> bytes:
    """The tree head of the leaves whose hashes are ``hashes`` (MTH, RFC 9162 2.1.1).

    Iterative (no recursion depth to run out of): the left-to-right stack of
    perfect subtrees, folded from the right at the end, gives exactly the
    split rule's tree."""
    if not hashes:
        return EMPTY_ROOT
    stack: list[tuple[int, bytes]] = []  # (height, hash) of perfect subtrees
    for h in hashes:
        height, node = 0, h
        while stack and stack[-1][0] == height:
            node = node_hash(stack.pop()[1], node)
            height += 1
        stack.append((height, node))
    node = stack.pop()[1]
    while stack:
        node = node_hash(stack.pop()[1], node)
    return node


class Tree:
    """Every level of the tree over ``hashes``, so proofs cost O(log^2 n), not O(n).

    A subtree of the RFC's tree always starts at a multiple of its largest
    power-of-two part, so every perfect subtree is one entry of a level;
    only the subtrees along the right edge are folded on demand."""

    def __init__(self, hashes: Sequence[bytes] = ()):
        self.size = 0
        self.levels: list[list[bytes]] = [[]]
        self.extend(hashes)

    def extend(self, hashes: Sequence[bytes]) -> None:
        """The tree with ``hashes`` appended: a log only grows, and every
        entry of a level is a perfect subtree, so only the new ones are made."""
        self.levels[0].extend(hashes)
        self.size = len(self.levels[0])
        level = 0
        while len(self.levels[level]) > 1:
            if level + 1 == len(self.levels):
                self.levels.append([])
            below, above = self.levels[level], self.levels[level + 1]
            above.extend(node_hash(below[i], below[i + 1]) for i in range(2 * len(above), len(below) - 1, 2))
            level += 1

    def range_root(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for a range that is a subtree of the RFC's tree (or a prefix of it)."""
        n = hi - lo
        if n == 0:
            return EMPTY_ROOT
        if n & (n - 1) == 0 and lo % n == 0:
            return self.levels[n.bit_length() - 1][lo // n]
        k = _split(n)
        return node_hash(self.range_root(lo, lo + k), self.range_root(lo + k, hi))

    def root(self, size: int | None = None) -> bytes:
        return self.range_root(0, self.size if size is None else size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """PATH(m, D[n]) of RFC 9162 2.1.3.1: the audit path of leaf ``index`` in the tree of ``size``."""
        n = self.size if size is None else size
        if not 0 <= index < n <= self.size:
            raise ProofError(f"leaf {index} is not in a tree of {n}")
        # Walk down from the root; each level adds the sibling subtree's head.
        levels: list[bytes] = []
        lo, hi, m = 0, n, index
        while hi - lo > 1:
            k = _split(hi - lo)
            if m < k:
                levels.append(self.range_root(lo + k, hi))
                hi = lo + k
            else:
                levels.append(self.range_root(lo, lo + k))
                lo, m = lo + k, m - k
        return list(reversed(levels))

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        """PROOF(m, D[n]) of RFC 9162 2.1.4.1, for 0 < size1 <= size2."""
        n = self.size if size2 is None else size2
        if not 0 < size1 <= n <= self.size:
            raise ProofError(f"no consistency proof from {size1} to {n}")
        out: list[bytes] = []
        # SUBPROOF(m, D[lo:hi], b), unrolled: the nodes are gathered top-down
        # and the RFC's list is their reverse.
        lo, hi, m, whole = 0, n, size1, True
        while True:
            size = hi - lo
            if m == size:
                if not whole:
                    out.append(self.range_root(lo, hi))
                break
            k = _split(size)
            if m <= k:
                out.append(self.range_root(lo + k, hi))
                hi = lo + k
            else:
                out.append(self.range_root(lo, lo + k))
                lo, m, whole = lo + k, m - k, False
        out.reverse()
        return out


def inclusion_proof(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    """PATH(m, D[n]) of RFC 9162 2.1.3.1: the audit path of leaf ``index`` (see ``Tree`` for many)."""
    if not 0 <= index < len(hashes):
        raise ProofError(f"leaf {index} is not in a tree of {len(hashes)}")
    return Tree(hashes).inclusion_proof(index)


def consistency_proof(size1: int, hashes: Sequence[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 9162 2.1.4.1, for 0 < size1 <= n."""
    if not 0 < size1 <= len(hashes):
        raise ProofError(f"no consistency proof from {size1} to {len(hashes)}")
    return Tree(hashes).consistency_proof(size1)


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root a leaf hash and its audit path lead to (RFC 9162 2.1.3.2)."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is past the tree of {size}")
    if len(leaf) != HASH_SIZE or any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("a hash in the proof is not 32 bytes")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            raise ProofError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the inclusion proof is shorter than the tree is deep")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], expected_root: bytes) -> None:
    """Raise ProofError unless ``proof`` shows leaf ``index`` under ``expected_root``."""
    if root_from_inclusion(index, size, leaf, proof) != expected_root:
        raise ProofError(f"leaf {index} is not under the root of the tree of {size}")


def verify_consistency(size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]) -> None:
    """Raise ProofError unless the tree of ``size2`` extends the one of ``size1`` (RFC 9162 2.1.4.2)."""
    if size1 < 0 or size2 < size1:
        raise ProofError(f"a tree of {size2} cannot extend one of {size1}")
    if size1 == size2:
        if proof:
            raise ProofError("trees of the same size need an empty proof")
        if root1 != root2:
            raise ProofError(f"two different roots for the tree of {size1}")
        return
    if size1 == 0:
        # Every tree "extends" the empty one: a proof of it proves nothing, and
        # is refused as RFC 9162's verifiers refuse it.
        raise ProofError("a consistency proof from the empty tree proves nothing")
    if not proof or any(len(p) != HASH_SIZE for p in proof):
        raise ProofError("the consistency proof is empty or holds a hash that is not 32 bytes")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # a power of two: the first tree is a node of the second
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the trees are deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is shorter than the trees are deep")
    if fr != root1:
        raise ProofError(f"the proof does not lead to the root of the tree of {size1}")
    if sr != root2:
        raise ProofError(f"the proof does not lead to the root of the tree of {size2}")
