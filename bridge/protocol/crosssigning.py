"""Matrix cross-signing, pure: canonical JSON, signed JSON, the three
cross-signing keys, and the check that a device is signed by its owner.

Everything here follows the client-server spec's "Signing JSON" and
"Cross-signing" sections: a signature covers the canonical JSON of the
object without its ``signatures`` and ``unsigned``; it is ed25519, in
unpadded base64, filed under ``signatures[user_id]["ed25519:" + key_id]``;
a cross-signing key's id is its public key.  The ed25519 itself is the
``cryptography`` package's.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any


USAGES = ("master", "self_signing", "user_signing")


def _private_key(seed: bytes) -> Any:
    # cryptography is loaded on first use: a bridge in a plain room never
    # signs, and one in an encrypted room signs beside its first sync.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(seed)


def b64(data: bytes) -> str:
    """Unpadded standard base64, as Matrix writes keys and signatures."""
    return base64.b64encode(data).decode().rstrip("=")


def unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def canonical_json(value: Any) -> bytes:
    """The spec's canonical JSON: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def signing_bytes(obj: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in obj.items() if k not in ("signatures", "unsigned")})


@dataclass(frozen=True)
class SigningKey:
    """One ed25519 key pair; ``seed`` is the 32-byte private key (kept secret)."""

    seed: bytes

    @classmethod
    def generate(cls) -> "SigningKey":
        return cls(os.urandom(32))  # an ed25519 private key is 32 random bytes (RFC 8032)

    @property
    def public(self) -> str:
        raw = _private_key(self.seed).public_key().public_bytes_raw()
        return b64(raw)

    def __repr__(self) -> str:  # never print the seed
        return f"SigningKey(public={self.public})"

    def sign(self, obj: dict[str, Any], user_id: str) -> dict[str, Any]:
        """``obj`` with this key's signature added beside the ones it has."""
        signature = b64(_private_key(self.seed).sign(signing_bytes(obj)))
        signatures = {u: dict(s) for u, s in (obj.get("signatures") or {}).items()}
        signatures.setdefault(user_id, {})[f"ed25519:{self.public}"] = signature
        return {**obj, "signatures": signatures}


def verify(obj: dict[str, Any], user_id: str, public_key: str) -> bool:
    """True when ``obj`` carries a valid signature of ``user_id``'s ed25519 key ``public_key``."""
    signature = ((obj.get("signatures") or {}).get(user_id) or {}).get(f"ed25519:{public_key}")
    if not isinstance(signature, str):
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(unb64(public_key)).verify(unb64(signature), signing_bytes(obj))
    except (InvalidSignature, ValueError):
        return False
    return True


def key_object(user_id: str, usage: str, key: SigningKey) -> dict[str, Any]:
    return {"user_id": user_id, "usage": [usage], "keys": {f"ed25519:{key.public}": key.public}}


@dataclass(frozen=True)
class Identity:
    """A user's three cross-signing keys (private)."""

    master: SigningKey
    self_signing: SigningKey
    user_signing: SigningKey

    @classmethod
    def generate(cls) -> "Identity":
        return cls(SigningKey.generate(), SigningKey.generate(), SigningKey.generate())

    def upload_body(self, user_id: str) -> dict[str, Any]:
        """The body of ``/keys/device_signing/upload``: the sub-keys signed by the master key."""
        return {"master_key": key_object(user_id, "master", self.master),
                "self_signing_key": self.master.sign(key_object(user_id, "self_signing", self.self_signing), user_id),
                "user_signing_key": self.master.sign(key_object(user_id, "user_signing", self.user_signing), user_id)}

    def to_json(self, user_id: str) -> dict[str, Any]:
        return {"user_id": user_id, **{usage: b64(getattr(self, usage).seed) for usage in USAGES}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Identity":
        return cls(*(SigningKey(unb64(data[usage])) for usage in USAGES))


def the_key(obj: Any, user_id: str, usage: str) -> str | None:
    """The public key of a cross-signing key object, when it is ``user_id``'s and for ``usage``."""
    if not isinstance(obj, dict) or obj.get("user_id") != user_id or usage not in (obj.get("usage") or []):
        return None
    keys = [k for k in (obj.get("keys") or {}).values() if isinstance(k, str)]
    return keys[0] if len(keys) == 1 else None


def self_signing_key(query: dict[str, Any], user_id: str) -> str | None:
    """From a ``/keys/query`` response: ``user_id``'s self-signing key, when
    their master key signed it."""
    master = the_key((query.get("master_keys") or {}).get(user_id), user_id, "master")
    ssk_obj = (query.get("self_signing_keys") or {}).get(user_id)
    ssk = the_key(ssk_obj, user_id, "self_signing")
    if master is None or ssk is None or not verify(ssk_obj, user_id, master):
        return None
    return ssk


def cross_signed_devices(query: dict[str, Any], user_id: str) -> dict[str, str]:
    """device id -> ed25519 key of each of ``user_id``'s devices that their
    self-signing key (signed by their master key) signed."""
    ssk = self_signing_key(query, user_id)
    if ssk is None:
        return {}
    out: dict[str, str] = {}
    for device_id, device in ((query.get("device_keys") or {}).get(user_id) or {}).items():
        if not isinstance(device, dict) or device.get("user_id") != user_id or device.get("device_id") != device_id:
            continue
        ed25519 = (device.get("keys") or {}).get(f"ed25519:{device_id}")
        if isinstance(ed25519, str) and verify(device, user_id, ssk):
            out[device_id] = ed25519
    return out
