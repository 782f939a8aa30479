"""Checkpoints in the C2SP signed-note format, against the format's published example.

The example key and note are those of golang.org/x/mod/sumdb/note
(note.go's package documentation and note_test.go: the "PeterNeumann" key),
the reference implementation the C2SP signed-note specification was written
from.  Ed25519 is deterministic (RFC 8032), so signing the same text with
the same key must give the published note byte for byte.
"""

from __future__ import annotations

import base64
import hashlib

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
    # Go's note.NewVerifier reads the hash as exactly 8 hex digits; bytes.fromhex skipped spaces.
    with pytest.raises(NoteError, match="8 hex digits"):
        cp.parse_verifier_key(VKEY.replace("c74f20a3", "c7 4f 20 a3"))


@pytest.mark.parametrize("size", [str(2 ** 64), "99999999999999999999"])
def test_a_tree_size_past_a_uint64_is_refused_as_c2sp_reads_it(size):
    with pytest.raises(NoteError, match="too large"):
        cp.parse_checkpoint(f"example.com/log\n{size}\n" + base64.b64encode(bytes(32)).decode() + "\n")
    assert cp.parse_checkpoint(f"example.com/log\n{2 ** 64 - 1}\n" + base64.b64encode(bytes(32)).decode() + "\n")


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


# The example checkpoint of the C2SP tlog-checkpoint specification
# (c2sp.org/tlog-checkpoint, tlog-checkpoint.md in the C2SP/C2SP repository,
# its opening example), copied verbatim.  The specification publishes no
# verifier key for it, so its signature cannot be checked here: what can be is
# that the body parses to what it says, that our formatter writes the same
# bytes, and that its signature line is read as one by an unknown key (to be
# ignored, as signed-note requires) rather than as a malformed note.
C2SP_CHECKPOINT = (
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    "\n"
    "\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
)

# The example note of the C2SP signed-note specification (c2sp.org/signed-note,
# signed-note.md in the C2SP/C2SP repository), copied verbatim; its text holds
# an empty line, which the format allows (the signatures follow the last one).
C2SP_NOTE_TEXT = "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned \u00e8 subito sera.\n"
C2SP_NOTE = (C2SP_NOTE_TEXT + "\n\u2014 quasimodo.example/salvatore "
             "NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+EhfLW9oJKONrMouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n")


def _signature_of(note: str) -> tuple[str, bytes]:
    line = note.rsplit("\n\n", 1)[1].rstrip("\n")
    assert line.startswith(cp.DASH)
    name, blob = line[len(cp.DASH):].split(" ")
    return name, base64.b64decode(blob, validate=True)


def test_the_c2sp_example_checkpoint_parses_and_is_formatted_byte_for_byte():
    body = C2SP_CHECKPOINT.split("\n\n")[0] + "\n"
    point = cp.parse_checkpoint(body)
    assert point.origin == "example.com/behind-the-sofa"
    assert point.size == 20852163
    assert point.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert point.extensions == ()
    assert point.body() == body
    # the signature line: the log's key name (the origin, as the spec asks),
    # a 4-byte key ID and a 64-byte Ed25519 signature
    name, data = _signature_of(C2SP_CHECKPOINT)
    assert name == point.origin and len(data) == 4 + 64
    # with an extension line the body still round-trips byte for byte
    extended = body + "an extension line\n"
    assert cp.parse_checkpoint(extended).extensions == ("an extension line",)
    assert cp.parse_checkpoint(extended).body() == extended


def test_the_c2sp_examples_are_refused_as_signed_by_another_key_not_as_malformed():
    mine = Ed25519PrivateKey.generate()
    public = cp.raw_public(mine.public_key())
    with pytest.raises(NoteError, match="not signed by the log's key.*example.com/behind-the-sofa"):
        cp.open_checkpoint(C2SP_CHECKPOINT, public, "example.com/behind-the-sofa")
    with pytest.raises(NoteError, match="not signed by the log's key.*quasimodo.example/salvatore"):
        cp.open_note(C2SP_NOTE, "quasimodo.example/salvatore", public)
    # a note whose text holds an empty line is still a note: signed by a key
    # we hold, it opens to its whole text, and a changed byte fails
    signed = cp.sign(C2SP_NOTE_TEXT, "quasimodo.example/salvatore", mine)
    assert cp.open_note(signed, "quasimodo.example/salvatore", public) == C2SP_NOTE_TEXT
    with pytest.raises(NoteError, match="does not hold"):
        cp.open_note(signed.replace("sera", "Sera"), "quasimodo.example/salvatore", public)
    # but a checkpoint's body has no empty line
    with pytest.raises(NoteError, match="non-empty"):
        cp.parse_checkpoint("example.com/log\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\nx\n")


def test_the_c2sp_key_id_is_computed_as_the_spec_says():
    # key ID = SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4],
    # checked against the published PeterNeumann verifier key (whose ID the
    # Go reference implementation computed the same way)
    name, public = cp.parse_verifier_key(VKEY)
    assert cp.key_hash(name, public) == hashlib.sha256(b"PeterNeumann\n\x01" + public).digest()[:4]
    assert cp.key_hash(name, public).hex() == "c74f20a3"
    # and the published note's signature line carries that ID
    assert _signature_of(NOTE)[1][:4].hex() == "c74f20a3"


def test_a_signature_block_read_as_signed_note_reads_it():
    """Split on newlines alone, no control character anywhere, every line
    well-formed before one is trusted; and a tree size in ASCII digits."""
    key = Ed25519PrivateKey.generate()
    public = cp.raw_public(key.public_key())
    note = cp.sign_checkpoint(Checkpoint("example.org/log", 5, bytes(range(32))), key)
    text, block = note.split("\n\n", 1)
    for broken in (text + "\n\n" + block.replace("\n", "\r\n"),  # CRLF on the signature line only
                   text + "\n\n" + block[:-1] + "\u2028\n",  # a line separator inside the block
                   text + "\n\n" + block[:-1] + "\x1c\n",
                   note + "\u2014 other not-base64!\n"):  # a malformed line after ours
        with pytest.raises(NoteError):
            cp.open_checkpoint(broken, public, "example.org/log")
    other = Ed25519PrivateKey.generate()
    unknown = cp.sign("example.org/log\n5\n" + base64.b64encode(bytes(range(32))).decode() + "\n", "another", other)
    assert cp.open_checkpoint(note + unknown.split("\n\n", 1)[1], public, "example.org/log").size == 5
    for size in ("\u0661\u0662", "\u00b2"):  # Arabic-Indic twelve; a superscript two (int() refuses it)
        digits = cp.sign(f"example.org/log\n{size}\n" + base64.b64encode(bytes(range(32))).decode() + "\n",
                         "example.org/log", key)
        with pytest.raises(NoteError, match="malformed"):
            cp.open_checkpoint(digits, public, "example.org/log")


def test_a_note_whose_text_ends_in_an_empty_line_is_signed_and_opened():
    """signed-note lets the text hold empty lines, the last one too: the
    signatures follow the note's last empty line.  Such a text was refused,
    signing and opening alike (it matters only for notes that are not
    checkpoints: a checkpoint's body holds no empty line)."""
    key = _peter()
    name, public = cp.parse_verifier_key(VKEY)
    text = TEXT + "\n"
    note = cp.sign(text, name, key)
    assert note.startswith(text + "\n\u2014 PeterNeumann ")
    assert cp.open_note(note, name, public) == text
    with pytest.raises(NoteError, match="does not hold"):  # the signature covers the empty line
        cp.open_note(TEXT + note[len(text):], name, public)
    with pytest.raises(NoteError, match="non-empty"):
        cp.parse_checkpoint("example.com/log\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n")


def test_every_signature_of_the_known_key_is_checked_not_only_the_first():
    """Two signature lines under the log's name and key id: signed-note says
    a known key's signature that fails rejects the whole note.  Only the
    first was checked, so a good one let a forged one after it pass."""
    key = Ed25519PrivateKey.generate()
    public = cp.raw_public(key.public_key())
    note = cp.sign_checkpoint(Checkpoint("example.org/log", 5, bytes(range(32))), key)
    line = note.split("\n\n", 1)[1]
    blob = base64.b64decode(line.rsplit(" ", 1)[1])
    forged = line.rsplit(" ", 1)[0] + " " + base64.b64encode(blob[:4] + bytes(64)).decode() + "\n"
    for broken in (note + forged, note.replace(line, forged + line)):  # after the good one, or before it
        with pytest.raises(NoteError, match="does not hold"):
            cp.open_checkpoint(broken, public, "example.org/log")
    assert cp.open_checkpoint(note + line, public, "example.org/log").size == 5  # the same good one twice
