"""The answer log's signing key: an Ed25519 key in its own 0600 file.

Kept like the cross-signing keys (``encryption/crosssigning.py``): never in
the store, written whole (temporary file, fsync, rename), readable by the
owner only.  The file holds the key in signed-note's private-key text,
``PRIVATE+KEY+<name>+<key hash>+<base64(0x01 || seed)>``, so the tools of
that ecosystem read it too.  A standby must be given the same file: it signs
the checkpoints of the same log after a takeover.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.wholefile import replace_whole

if TYPE_CHECKING:  # cryptography is loaded when the bridge first signs, after its first sync
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


class LogKeyError(Exception):
    """The log key can't be had: one sentence saying why and what to do."""


@dataclass(frozen=True)
class LogKey:
    origin: str
    private: Ed25519PrivateKey

    @property
    def public(self) -> bytes:
        from bridge.protocol import checkpoint as cp

        return cp.raw_public(self.private.public_key())

    @property
    def verifier_key(self) -> str:
        from bridge.protocol import checkpoint as cp

        return cp.verifier_key(self.origin, self.public)


def key_file(store_path: Path, configured: str | None = None) -> Path:
    return Path(configured) if configured else store_path.with_name(store_path.name + ".log-key")


def _text(key: LogKey) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    from bridge.protocol import checkpoint as cp

    seed = key.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return (f"PRIVATE+KEY+{key.origin}+{cp.key_hash(key.origin, key.public).hex()}+"
            f"{base64.b64encode(bytes([cp.ED25519]) + seed).decode()}\n")


def read_key(path: Path) -> LogKey:
    """The key in ``path``; FileNotFoundError when there is none, LogKeyError when it is damaged."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from bridge.protocol import checkpoint as cp

    text = path.read_text(encoding="utf-8").strip()
    parts = text.split("+", 4)
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise LogKeyError(f"the answer log's key file {path} is not a signed-note private key")
    try:
        data = base64.b64decode(parts[4], validate=True)
        key = LogKey(parts[2], Ed25519PrivateKey.from_private_bytes(data[1:]))
    except (binascii.Error, ValueError):
        raise LogKeyError(f"the answer log's key file {path} is damaged") from None
    if data[:1] != bytes([cp.ED25519]) or cp.key_hash(key.origin, key.public).hex() != parts[3]:
        raise LogKeyError(f"the answer log's key file {path} is damaged (its key hash does not match)")
    return key


def write_key(path: Path, key: LogKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, _text(key).encode(), mode=0o600)


def check_present(path: Path, leaves: int, made: bool = False) -> None:
    """At start, before anything is loaded: a log with leaves needs its key
    file; so does a standby's whose leader made the key (``made``: the store
    knows it), leaves or not yet."""
    if leaves and not path.exists():
        raise LogKeyError(f"the answer log has {leaves} leaves but its key file {path} is missing; restore it "
                          "(a new key would orphan the checkpoints the rooms hold)")
    if made and not path.exists():
        raise LogKeyError(f"the answer log's key was made by the instance that leads, and this one's key file "
                          f"{path} is missing; give it the same file")


def check_same(path: Path, signed_with: str | None) -> None:
    """At start, before anything is loaded: the key file holds the key that
    signed the log's checkpoints (``signed_with``, its verifier key), by the
    key hash both carry.  Another key (a wrong backup restored, a standby
    given another file) would sign on, and ``verify --room`` would then
    call every checkpoint the rooms hold forged."""
    if signed_with is None:
        return
    try:
        parts = path.read_text(encoding="utf-8").strip().split("+", 4)
    except OSError:
        return  # missing or unreadable: said by check_present / load_or_create
    stored = signed_with.split("+", 2)
    if len(parts) == 5 and len(stored) == 3 and parts[2:4] != stored[:2]:
        raise LogKeyError(f"the answer log's key file {path} holds another key ({parts[2]}+{parts[3]}) than the "
                          f"one that signed this log's checkpoints ({stored[0]}+{stored[1]}); restore that key's "
                          "file (signing on with another would orphan the checkpoints the rooms hold)")


def load_or_create(path: Path, origin: str, leaves: int) -> LogKey:
    """The log's key; created when there is none and the log is empty.  A log
    with leaves and no key is refused: a new key would orphan every
    checkpoint the rooms hold."""
    try:
        key = read_key(path)
    except FileNotFoundError:
        if leaves:
            raise LogKeyError(f"the answer log has {leaves} leaves but its key file {path} is missing; restore it "
                              "(a new key would orphan the checkpoints the rooms hold)") from None
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = LogKey(origin, Ed25519PrivateKey.generate())
        write_key(path, key)
        return key
    except OSError as exc:
        raise LogKeyError(f"the answer log's key file {path} can't be read ({exc.strerror})") from None
    if key.origin != origin:
        raise LogKeyError(f"the answer log's key file {path} is for the log {key.origin!r}, not {origin!r}")
    return key
