"""Cross-signing, pure: the spec's signing format and the chain master ->
self-signing -> device."""

from __future__ import annotations

import pytest
from vodozemac import Ed25519PublicKey, Ed25519Signature

from bridge.protocol.crosssigning import (Identity, SigningKey, canonical_json, cross_signed_devices,
                                          self_signing_key, unb64, verify)

# The signing key of the spec's "Signing JSON" examples (appendices).
SPEC_KEY = SigningKey(unb64("YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"))
ALICE = "@alice:hs"


def test_signatures_are_the_specs_examples():
    assert SPEC_KEY.sign({}, "domain")["signatures"]["domain"] == {
        f"ed25519:{SPEC_KEY.public}": "K8280/U9SSy9IVtjBuVeLr+HpOB4BQFWbg+UZaADMtTdGYI7Geitb76LTrr5QV/7Xg4ahLwYGYZzuHGZKM5ZAQ"}
    assert SPEC_KEY.sign({"one": 1, "two": "Two"}, "domain")["signatures"]["domain"][f"ed25519:{SPEC_KEY.public}"] == \
        "KqmLSbO39/Bzb0QIYE82zqLwsA+PDzYIpIRA2sRQ4sL53+sN6/fpNSoqE7BP7vBZhG6kYdD13EIMJpvhJI+6Bw"


def test_canonical_json_sorts_keys_drops_spaces_and_keeps_unicode():
    assert canonical_json({"b": 2, "a": {"d": [1, "é"], "c": None}}) == '{"a":{"c":null,"d":[1,"é"]},"b":2}'.encode()


def test_signing_ignores_signatures_and_unsigned_and_keeps_other_signatures():
    key = SigningKey.generate()
    obj = {"x": 1, "unsigned": {"age": 5}, "signatures": {ALICE: {"ed25519:DEV": "other"}}}
    signed = key.sign(obj, ALICE)
    assert signed["signatures"][ALICE]["ed25519:DEV"] == "other"
    assert verify({**signed, "unsigned": {"age": 99}}, ALICE, key.public)
    assert not verify({**signed, "x": 2}, ALICE, key.public)
    assert not verify(signed, "@bob:hs", key.public)
    # Another ed25519 implementation agrees.
    raw = unb64(signed["signatures"][ALICE][f"ed25519:{key.public}"])
    Ed25519PublicKey.from_base64(key.public).verify_signature(
        canonical_json({"x": 1}), Ed25519Signature.from_base64(signed["signatures"][ALICE][f"ed25519:{key.public}"]))
    assert len(raw) == 64


def test_the_seed_is_never_in_the_repr():
    key = SigningKey.generate()
    assert repr(key) == f"SigningKey(public={key.public})" and "seed" not in repr(key)


def device(user: str, device_id: str) -> tuple[dict, str]:
    own = SigningKey.generate()
    obj = {"user_id": user, "device_id": device_id, "algorithms": ["m.megolm.v1.aes-sha2"],
           "keys": {f"ed25519:{device_id}": own.public, f"curve25519:{device_id}": "c"}}
    return own.sign(obj, user), own.public


def query_of(identity: Identity, user: str, devices: dict) -> dict:
    body = identity.upload_body(user)
    return {"master_keys": {user: body["master_key"]}, "self_signing_keys": {user: body["self_signing_key"]},
            "device_keys": {user: devices}}


def test_a_device_signed_by_the_self_signing_key_of_the_master_key_is_cross_signed():
    identity = Identity.generate()
    signed_dev, signed_key = device(ALICE, "SIGNED")
    plain_dev, _ = device(ALICE, "PLAIN")
    query = query_of(identity, ALICE, {"SIGNED": identity.self_signing.sign(signed_dev, ALICE), "PLAIN": plain_dev})
    assert self_signing_key(query, ALICE) == identity.self_signing.public
    assert cross_signed_devices(query, ALICE) == {"SIGNED": signed_key}


@pytest.mark.parametrize("break_it", ["ssk_not_signed_by_master", "device_signed_by_user_signing", "other_user"])
def test_a_broken_chain_signs_nothing(break_it):
    identity = Identity.generate()
    dev, _ = device(ALICE, "DEV")
    query = query_of(identity, ALICE, {"DEV": identity.self_signing.sign(dev, ALICE)})
    if break_it == "ssk_not_signed_by_master":
        query["self_signing_keys"][ALICE] = Identity.generate().master.sign(
            {k: v for k, v in query["self_signing_keys"][ALICE].items() if k != "signatures"}, ALICE)
    elif break_it == "device_signed_by_user_signing":
        query["device_keys"][ALICE]["DEV"] = identity.user_signing.sign(dev, ALICE)
    else:
        query["device_keys"][ALICE]["DEV"] = {**query["device_keys"][ALICE]["DEV"], "user_id": "@mallory:hs"}
    assert cross_signed_devices(query, ALICE) == {}


def test_an_identity_survives_its_json():
    identity = Identity.generate()
    again = Identity.from_json(identity.to_json(ALICE))
    assert again.upload_body(ALICE) == identity.upload_body(ALICE)
