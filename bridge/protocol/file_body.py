"""A file's body as it arrives, chunk by chunk: pure bookkeeping, no I/O.

The shell (``service/answering/attachments.py``) reads the content
repository's response in chunks and feeds them here; what comes back is what
it writes to disk.  Here the body is counted against the limit (whatever
Content-Length said), judged short against the homeserver's length (and
the event's ``info.size`` where nothing surer judges it), and, for a file sent in an
encrypted room, decrypted as it streams with its ciphertext's sha256 checked
at the end (the Matrix spec's encrypted attachments: AES-256-CTR, a JWK key,
a 16-byte counter block, the hash of the ciphertext).  A body is only good
once ``end`` returned: before that nothing of it may be kept.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Any


class BodyTooLarge(Exception):
    """The body is (or was announced as) longer than the limit."""


class BodyCutShort(Exception):
    """The body ended before every length it was promised: a failed download, worth another try."""


class BodyUndecryptable(Exception):
    """An encrypted file whose key, counter block or hash does not open what arrived."""


def _unpadded_b64(value: Any) -> bytes:
    """Unpadded base64, standard or URL-safe (the spec's JWK ``k`` is URL-safe)."""
    if not isinstance(value, str):
        raise BodyUndecryptable("not a base64 string")
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BodyUndecryptable("not valid base64") from None


class FileBody:
    """One download's body.  ``limit``: the most bytes kept; ``file``: the
    event's ``content.file`` for a file sent in an encrypted room (the key
    rides in the decrypted event), else None."""

    def __init__(self, limit: int, file: dict[str, Any] | None = None):
        self.limit = limit
        self.received = 0
        self.promised = 0  # the longest length the homeserver gave the body (Content-Length)
        self.announced = 0  # the length the event's ``info.size`` claims (the sender's client's word)
        self._decryptor: Any = None
        self._sha256: Any = None
        self._expected_hash = b""
        if file is not None:
            self._decryptor, self._expected_hash = _decryption(file)
            self._sha256 = hashlib.sha256()

    def expect(self, length: Any) -> None:
        """The length the homeserver gives the body (Content-Length); anything
        but a whole number of bytes is no promise."""
        if _length(length, self.limit) is not None:
            self.promised = max(self.promised, length)

    def announce(self, size: Any) -> None:
        """The length the event's ``info.size`` claims.  It judges a body only
        where nothing surer does: one the homeserver gave no length (a plain
        body that ends early looks like one that ended; an encrypted one
        whose hash fails may have been cut).  A body whole by the
        homeserver's length or by its hash is kept, however wrong the
        sender's client counted (sending it again would not help).  A claim
        past the limit refuses nothing by itself: the homeserver's length
        refuses a file that is too large before a byte is read, and a small
        file a client counted wrong is kept, not called too large."""
        if isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= self.limit:
            self.announced = size

    def take(self, chunk: bytes) -> bytes:
        """The next chunk as it arrived -> what to write (plaintext)."""
        self.received += len(chunk)
        if self.received > self.limit:
            raise BodyTooLarge(f"more than the limit of {self.limit} bytes arrived")
        if self._decryptor is None:
            return chunk
        self._sha256.update(chunk)
        return self._decryptor.update(chunk)

    def end(self) -> bytes:
        """The body ended: the last plaintext bytes, once it is whole and (when
        encrypted) its hash matches; raises otherwise."""
        if self.received < self.promised:
            raise BodyCutShort(f"{self.received} of {self.promised} bytes arrived")
        short = BodyCutShort(f"{self.received} of the {self.announced} bytes the event announced arrived")
        if self._decryptor is None:
            if self.received < self.announced and not self.promised:
                raise short
            return b""
        if not hmac.compare_digest(self._sha256.digest(), self._expected_hash):
            if self.received < self.announced and not self.promised:
                raise short
            raise BodyUndecryptable("the ciphertext's sha256 is not the one the event names")
        return self._decryptor.finalize()


def _length(value: Any, limit: int) -> int | None:
    """A length in bytes (None when it is not a whole number); BodyTooLarge past ``limit``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    if value > limit:
        raise BodyTooLarge(f"announced as {value} bytes, over the limit of {limit}")
    return value


def _decryption(file: dict[str, Any]) -> tuple[Any, bytes]:
    """An AES-256-CTR decryptor for ``file`` and the sha256 its ciphertext must have."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key, hashes = file.get("key"), file.get("hashes")
    if not isinstance(key, dict) or not isinstance(hashes, dict):
        raise BodyUndecryptable("the file has no key or no hashes")
    if key.get("alg", "A256CTR") != "A256CTR":
        raise BodyUndecryptable(f"the key is for {key.get('alg')!r}, not A256CTR")
    secret, counter, expected = _unpadded_b64(key.get("k")), _unpadded_b64(file.get("iv")), \
        _unpadded_b64(hashes.get("sha256"))
    if len(secret) != 32 or len(counter) != 16 or len(expected) != 32:
        raise BodyUndecryptable("the key, counter block or hash has the wrong length")
    # The counter block increments as a whole; senders zero its low 64 bits,
    # so it never carries into the nonce half for any file a limit allows.
    return Cipher(algorithms.AES(secret), modes.CTR(counter)).decryptor(), expected
