"""Checkpoints of the answer log: C2SP tlog-checkpoint bodies in C2SP signed notes.

Pure (ed25519 through ``cryptography``, no I/O).  A checkpoint body is

    <origin>\\n<tree size>\\n<base64 root hash>\\n[extension lines\\n]

and the signed note adds a blank line and one line per signature,
``— <key name> <base64(key hash || signature)>``, where the key hash is the
first four bytes of SHA-256(key name || 0x0A || 0x01 || public key) and the
Ed25519 signature covers the body (its final newline included).  The log's
key is named by the log's origin.  A verifier key is written
``<name>+<hex key hash>+<base64(0x01 || public key)>`` (signed-note's vkey).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

ED25519 = 0x01
DASH = "\u2014 "
MAX_SIGNATURES = 100
_SIZE_DIGITS = 20  # a tree size is a 64-bit count: 2^64 - 1 has 20 digits


class NoteError(ValueError):
    """A note or checkpoint that does not parse, or whose signature does not hold."""


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "".join(line + "\n" for line in lines)


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_hash(name: str, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()[:4]


def verifier_key(name: str, public: bytes) -> str:
    """The signed-note verifier key text for ``name``'s Ed25519 key."""
    return f"{name}+{key_hash(name, public).hex()}+{base64.b64encode(bytes([ED25519]) + public).decode()}"


def parse_verifier_key(vkey: str) -> tuple[str, bytes]:
    """(name, raw public key) of a verifier key; NoteError when it is not one."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or not _good_name(parts[0]):
        raise NoteError("not a verifier key (name+hash+key)")
    name, hexhash, b64 = parts
    if not re.fullmatch(r"[0-9a-fA-F]{8}", hexhash):  # (bytes.fromhex skips spaces: "c7 4f 20 a3" passed)
        raise NoteError("the verifier key's hash is not 8 hex digits")
    try:
        data = base64.b64decode(b64, validate=True)
        wanted = bytes.fromhex(hexhash)
    except (binascii.Error, ValueError):
        raise NoteError("the verifier key's hash or key is not hex / base64") from None
    if len(data) != 33 or data[0] != ED25519 or len(wanted) != 4:
        raise NoteError("the verifier key is not an Ed25519 key")
    if key_hash(name, data[1:]) != wanted:
        raise NoteError("the verifier key's hash does not match its name and key")
    return name, data[1:]


def _good_name(name: str) -> bool:
    return bool(name) and not any(c.isspace() or c == "+" for c in name)


def sign(text: str, name: str, key: Ed25519PrivateKey) -> str:
    """The signed note of ``text`` (ending in a newline) by ``name``'s key."""
    _check_text(text)
    if not _good_name(name):
        raise NoteError(f"{name!r} can't name a key (empty, a space or a '+')")
    signature = key.sign(text.encode())
    blob = base64.b64encode(key_hash(name, raw_public(key.public_key())) + signature).decode()
    return f"{text}\n{DASH}{name} {blob}\n"


def _check_text(text: str) -> None:
    # signed-note lets the text hold empty lines, its last line too: the
    # signatures follow the note's last empty line, so the split is never in
    # doubt.  A checkpoint's body holds none, and parse_checkpoint says so.
    if not text.endswith("\n"):
        raise NoteError("a note's text ends in a newline")
    _check_utf8(text)
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note holds no control characters")


def _check_utf8(note: str) -> None:
    # A lone surrogate (JSON's "\ud800" reads into one) is no UTF-8: the
    # signature can't be checked over bytes the text does not have.
    try:
        note.encode("utf-8")
    except UnicodeEncodeError:
        raise NoteError("a note is UTF-8 text (this one holds a lone surrogate)") from None


def open_note(note: str, name: str, public: bytes) -> str:
    """The text of ``note`` once its signature by (``name``, ``public``) holds;
    NoteError naming what is wrong otherwise (signed by another key, a
    signature that fails, a note that does not parse)."""
    _check_utf8(note)
    at = note.rfind("\n\n")
    if at < 0 or not note.endswith("\n"):
        raise NoteError("not a signed note (no blank line before the signatures)")
    # The signature block too is split on "\n" alone and holds no control
    # character: a carriage return or a line separator inside it is no
    # signature line (as Go's note.Open reads it).
    text, lines = note[:at + 1], note[at + 2:-1].split("\n")
    _check_text(text)
    if any(ord(c) < 0x20 or c in "\u2028\u2029\x85" for line in lines for c in line):
        raise NoteError("a note's signature lines hold no control characters")
    if not lines or len(lines) > MAX_SIGNATURES:
        raise NoteError("a signed note has 1 to 100 signature lines")
    wanted = key_hash(name, public)
    found_other = []
    ours: list[bytes] = []
    for line in lines:  # every line read before any is trusted: a malformed one anywhere refuses the note
        if not line.startswith(DASH):
            raise NoteError(f"not a signature line: {line[:60]!r}")
        signer, _, blob = line[len(DASH):].rpartition(" ")
        try:
            data = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise NoteError(f"the signature of {signer} is not base64") from None
        if len(data) < 5 or not _good_name(signer):
            raise NoteError(f"malformed signature line: {line[:60]!r}")
        if signer != name or data[:4] != wanted:
            found_other.append(signer)
        else:
            ours.append(data)
    # Every line of the log's name and key id is checked, not the first
    # alone: signed-note says a known key's signature that fails rejects the
    # whole note, so a good one can't carry a bad one past the check.
    for data in ours:
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(data[4:], text.encode())
        except (InvalidSignature, ValueError):
            raise NoteError(f"the signature of {name} does not hold over this note") from None
    if ours:
        return text
    raise NoteError(f"not signed by the log's key {verifier_key(name, public)} "
                    f"(signed by: {', '.join(found_other) or 'nobody'}, with another key)")


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint a (verified) note text states; NoteError when it is not one."""
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise NoteError("a checkpoint has an origin, a size and a root hash, each on its line")
    if "" in lines[:-1]:
        raise NoteError("a checkpoint's lines are all non-empty")
    origin, size, root = lines[0], lines[1], lines[2]
    # ASCII decimal: str.isdigit takes "١٢" (and "²", which int() refuses).
    if not origin or not (size.isascii() and size.isdigit()) or (size != "0" and size.startswith("0")):
        raise NoteError("the checkpoint's origin or tree size is malformed")
    if len(size) > _SIZE_DIGITS or int(size) >= 2 ** 64:  # (C2SP reads it as a uint64, and so refuses more)
        raise NoteError("the checkpoint's tree size is too large")
    try:
        raw = base64.b64decode(root, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("the checkpoint's root hash is not base64") from None
    if len(raw) != 32:
        raise NoteError("the checkpoint's root hash is not 32 bytes")
    return Checkpoint(origin, int(size), raw, tuple(lines[3:-1]))


def open_checkpoint(note: str, public: bytes, origin: str) -> Checkpoint:
    """A signed checkpoint of the log ``origin``, its signature checked."""
    checkpoint = parse_checkpoint(open_note(note, origin, public))
    if checkpoint.origin != origin:
        raise NoteError(f"the checkpoint is of the log {checkpoint.origin!r}, not {origin!r}")
    return checkpoint


def sign_checkpoint(checkpoint: Checkpoint, key: Ed25519PrivateKey) -> str:
    return sign(checkpoint.body(), checkpoint.origin, key)
