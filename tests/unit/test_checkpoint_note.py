"""Checkpoints in the C2SP signed-note format, against the format's published example.

The example key and note are those of golang.org/x/mod/sumdb/note
(note.go's package documentation and note_test.go: the "PeterNeumann" key),
the reference implementation the C2SP signed-note specification was written
from.  Ed25519 is deterministic (RFC 8032), so signing the same text with
the same key must give the published note byte for byte.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.protocol import checkpoint as cp
from bridge.protocol.checkpoint import Checkpoint, NoteError

VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
NOTE = TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"


def _peter() -> Ed25519PrivateKey:
    seed = base64.b64decode(SKEY.split("+", 4)[4])
    assert seed[0] == cp.ED25519
    return Ed25519PrivateKey.from_private_bytes(seed[1:])


def test_the_published_note_is_reproduced_and_opened():
    key = _peter()
    assert cp.verifier_key("PeterNeumann", cp.raw_public(key.public_key())) == VKEY
    assert cp.sign(TEXT, "PeterNeumann", key) == NOTE
    name, public = cp.parse_verifier_key(VKEY)
    assert cp.open_note(NOTE, name, public) == TEXT


def test_a_changed_text_or_another_key_is_refused():
    name, public = cp.parse_verifier_key(VKEY)
    with pytest.raises(NoteError, match="does not hold"):
        cp.open_note(NOTE.replace("cryptography", "cryptographY"), name, public)
    other = cp.sign(TEXT, "PeterNeumann", Ed25519PrivateKey.generate())
    with pytest.raises(NoteError, match="not signed by the log's key"):
        cp.open_note(other, name, public)
    with pytest.raises(NoteError):
        cp.parse_verifier_key(VKEY.replace("c74f20a3", "c74f20a4"))


def test_a_checkpoint_round_trips_and_says_what_is_wrong():
    key = Ed25519PrivateKey.generate()
    public = cp.raw_public(key.public_key())
    point = Checkpoint("example.org/log", 5, bytes(range(32)))
    note = cp.sign_checkpoint(point, key)
    assert note.startswith("example.org/log\n5\n" + base64.b64encode(bytes(range(32))).decode() + "\n\n\u2014 ")
    assert cp.open_checkpoint(note, public, "example.org/log") == point
    for broken in ("", "garbage", note.replace("\n5\n", "\n6\n"), note[: len(note) // 2]):
        with pytest.raises(NoteError):
            cp.open_checkpoint(broken, public, "example.org/log")
