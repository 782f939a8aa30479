"""Appservice mode's encryption: what a transaction carries for the bridge's
device, in the shape nio takes a sync response in."""

from __future__ import annotations

from nio import SyncResponse

from types import SimpleNamespace

from bridge.service.encryption.ascrypto import extensions_sync, take_extensions

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


class _Nio:
    """nio's client as ``take_extensions`` sees it: what it was handed."""

    user_id, device_id = BOT, DEVICE

    def __init__(self, uploaded: int):
        self.olm = SimpleNamespace(uploaded_key_count=uploaded)
        self.handed: list[SyncResponse] = []

    async def receive_response(self, response: SyncResponse) -> None:
        self.handed.append(response)
        self.olm.uploaded_key_count = response.device_key_count.signed_curve25519 or self.olm.uploaded_key_count


def _counts(n: int) -> dict:
    return {"org.matrix.msc3202.device_one_time_keys_count": {BOT: {DEVICE: {"signed_curve25519": n}}}}


async def test_a_key_count_nio_already_has_is_not_handed_to_it_again():
    client = _Nio(uploaded=50)
    # Synapse repeats the count in every transaction: the same count is news to nobody.
    assert await take_extensions(client, {"events": [], **_counts(50)}, "t1") is False
    assert client.handed == []
    # A changed count (keys claimed), a device list or a to-device message is.
    assert await take_extensions(client, {"events": [], **_counts(49)}, "t2") is True
    assert client.olm.uploaded_key_count == 49
    changed = {"org.matrix.msc3202.device_lists": {"changed": ["@alice:hs"], "left": []}}
    assert await take_extensions(client, {"events": [], **_counts(49), **changed}, "t3") is True
    assert [r.next_batch for r in client.handed] == ["appservice-t2", "appservice-t3"]


async def test_a_device_with_no_one_time_keys_left_has_them_uploaded_again():
    """Synapse names a device whose one-time keys were all claimed by an empty
    entry, and nio takes no count of 0 (nor knows any after a restart): a
    bridge back to none left never uploaded more, and no one could start an
    Olm session with it to send it room keys."""
    from nio.crypto.olm_machine import Olm

    client = _Nio(uploaded=None)
    none_left = {"org.matrix.msc3202.device_one_time_keys_count": {BOT: {DEVICE: {}}}}
    await take_extensions(client, {"events": [], **none_left}, "t1")
    assert client.olm.uploaded_key_count == 0
    # As nio's machine judges it: keys are due.
    machine = SimpleNamespace(account=SimpleNamespace(shared=True, max_one_time_keys=50),
                              uploaded_key_count=client.olm.uploaded_key_count)
    assert Olm.should_upload_keys.fget(machine) is True
    # A sync (bot mode) says 0 itself.
    from bridge.service.encryption.devicenews import device_sync, hand_to_nio

    synced = _Nio(uploaded=None)
    await hand_to_nio(synced, device_sync([], [], [], {"signed_curve25519": 0}), "s1")
    assert synced.olm.uploaded_key_count == 0
    # No entry for the device: nothing told.
    other = _Nio(uploaded=None)
    await take_extensions(other, {"events": [], "org.matrix.msc3202.device_one_time_keys_count": {BOT: {}}}, "t2")
    assert other.olm.uploaded_key_count is None
