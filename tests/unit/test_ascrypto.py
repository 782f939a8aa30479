"""Appservice mode's encryption: what a transaction carries for the bridge's
device, in the shape nio takes a sync response in."""

from __future__ import annotations

from nio import SyncResponse

from bridge.service.encryption.ascrypto import extensions_sync

BOT, DEVICE = "@askbot:hs", "BRIDGEDEV"


def test_only_the_bridge_devices_to_device_messages_key_counts_and_device_lists_are_taken():
    key = {"type": "m.room.encrypted", "sender": "@alice:hs", "content": {"algorithm": "m.olm.v1.curve25519-aes-sha2"}}
    body = {"events": [],
            "de.sorunome.msc2409.to_device": [
                {**key, "to_user_id": BOT, "to_device_id": DEVICE},
                {**key, "to_user_id": BOT, "to_device_id": "OTHER"},
                {**key, "to_user_id": "@askwright_x:hs", "to_device_id": DEVICE}],
            "org.matrix.msc3202.device_lists": {"changed": ["@alice:hs"], "left": ["@bob:hs"]},
            "org.matrix.msc3202.device_one_time_keys_count": {BOT: {DEVICE: {"signed_curve25519": 7},
                                                                    "OTHER": {"signed_curve25519": 1}}}}
    data = extensions_sync(body, BOT, DEVICE)
    assert data["to_device"]["events"] == [key]
    assert data["device_lists"] == {"changed": ["@alice:hs"], "left": ["@bob:hs"]}
    assert data["device_one_time_keys_count"] == {"signed_curve25519": 7}
    parsed = SyncResponse.from_dict({**data, "next_batch": "appservice-1"})
    assert isinstance(parsed, SyncResponse)
    assert parsed.device_key_count.signed_curve25519 == 7 and parsed.device_list.changed == ["@alice:hs"]


def test_a_transaction_without_extensions_carries_nothing_and_junk_is_ignored():
    assert extensions_sync({"events": []}, BOT, DEVICE)["to_device"]["events"] == []
    junk = {"de.sorunome.msc2409.to_device": "no", "org.matrix.msc3202.device_lists": [1],
            "org.matrix.msc3202.device_one_time_keys_count": "x"}
    data = extensions_sync(junk, BOT, DEVICE)
    assert data["to_device"]["events"] == [] and data["device_lists"] == {"changed": [], "left": []}
    assert data["device_one_time_keys_count"] == {}
