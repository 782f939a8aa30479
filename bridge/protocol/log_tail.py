"""A checkpoint over the leaves logged since the latest one.  Pure.

The bridge signs at most every ``audit.checkpoint_every``; an export taken
meanwhile holds leaves no checkpoint covers yet, and ``verify`` would name
every record under them.  Whoever holds the log's key may sign them, and
only on top of the log as it was signed: the leaves under the latest
checkpoint must make the root it signed, or nothing more is signed over them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from bridge.protocol import checkpoint as cp, merkle

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


class TailRefused(ValueError):
    """The leaves are not those the latest checkpoint signed: nothing is signed over them."""


def sign_tail(hashes: Sequence[bytes], latest: str | None, origin: str, key: Ed25519PrivateKey,
              kept: str | None = None) -> str | None:
    """A signed checkpoint of all ``hashes`` (leaf hashes, in order) when
    they are more than the ``latest`` checkpoint (a signed note) covers, or
    when there is none (of no leaves too); None when it covers them all.  ``kept``: another checkpoint the leaves
    must make too (the one kept beside the key)."""
    public = cp.raw_public(key.public_key())
    size = under(hashes, latest, origin, public) if latest is not None else 0
    if kept is not None:
        under(hashes, kept, origin, public)
    if len(hashes) <= size and latest is not None:
        return None  # (with none, the empty log's checkpoint: size 0, the empty tree's root)
    return cp.sign_checkpoint(cp.Checkpoint(origin, len(hashes), merkle.root(hashes)), key)


def under(hashes: Sequence[bytes], note: str, origin: str, public: bytes) -> int:
    """The size ``note`` signed, when ``hashes`` begin with the leaves it
    signed; TailRefused saying how they differ otherwise."""
    signed = signed_by(note, origin, public)
    if len(hashes) < signed.size:
        raise TailRefused(f"the store holds {len(hashes)} leaves, fewer than the {signed.size} a checkpoint signed")
    if merkle.root(hashes[:signed.size]) != signed.root:
        raise TailRefused(f"the first {signed.size} leaves are not those the latest checkpoint signed")
    return signed.size


def signed_by(note: str, origin: str, public: bytes) -> cp.Checkpoint:
    """The checkpoint ``note`` as the key signed it.  What the store holds is
    only what its writer says: a root put there under a forged signature
    would have the key vouch for a rewritten log."""
    try:
        return cp.open_checkpoint(note, public, origin)
    except cp.NoteError as exc:
        raise TailRefused(f"the latest checkpoint is not one this log's key signed ({exc})") from None
