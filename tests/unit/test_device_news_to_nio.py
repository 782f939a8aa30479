"""What the bridge's device is told of a sync or a transaction
(``devicenews.hand_to_nio``), on a real matrix-nio client with its olm
machine: the key requests the bridge sent its own user's sessions come back
to the device that sent them, and are not taken as someone asking it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nio import AsyncClient

from bridge.service.encryption.devicenews import device_sync, hand_to_nio
from bridge.service.transport.matrix import client_config

BOT, DEVICE = "@askbot:example.org", "BRIDGE"
ROOM = "!room:example.org"


def _client(folder: Path) -> AsyncClient:
    folder.mkdir(exist_ok=True)
    client = AsyncClient("http://127.0.0.1:1", BOT, store_path=str(folder), config=client_config(encryption=True))
    client.restore_login(BOT, DEVICE, "token")
    return client


def _request(requesting_device: str, request_id: str) -> dict[str, Any]:
    return {"type": "m.room_key_request", "sender": BOT,
            "content": {"action": "request", "requesting_device_id": requesting_device, "request_id": request_id,
                        "body": {"algorithm": "m.megolm.v1.aes-sha2", "room_id": ROOM,
                                 "sender_key": "k" * 43, "session_id": "s" * 43}}}


async def test_the_devices_own_key_request_coming_back_is_not_answered_and_anothers_is(tmp_path, caplog) -> None:
    client = _client(tmp_path / "keys")
    try:
        caplog.set_level(logging.WARNING, logger="nio")
        # The bridge asked its own user's sessions for a key it misses: the homeserver delivers it to this device too.
        assert not await hand_to_nio(client, device_sync([_request(DEVICE, "mine")], [], [], {}), "t1")
        assert "Failed to re-share" not in caplog.text
        assert "mine" not in client.olm.received_key_requests
        # Another session of the bridge's user asking is still nio's to answer (here: it has no such key).
        assert await hand_to_nio(client, device_sync([_request("ELEMENT", "theirs")], [], [], {}), "t2")
        assert "Failed to re-share key " + "s" * 43 in caplog.text
    finally:
        await client.close()
