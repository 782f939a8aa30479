"""Whether a sender's devices can settle the trust in their message now
(``Crypto.devices_settled``), on a real matrix-nio client with its olm
machine: not for someone never queried, yes once their devices are read, not
while they are marked outdated, and under ``cross-signed`` not before their
cross-signing keys are read."""

from __future__ import annotations

from pathlib import Path

from nio import AsyncClient
from nio.crypto import OlmDevice

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import client_config

PERSON = "@person:example.org"


class _CrossSigning:
    def __init__(self) -> None:
        self.read: set[str] = set()

    def known(self, user_id: str) -> bool:
        return user_id in self.read


async def test_a_senders_devices_settle_once_read_and_not_while_outdated(tmp_path: Path) -> None:
    client = AsyncClient("http://127.0.0.1:1", "@askbot:example.org", store_path=str(tmp_path),
                         config=client_config(encryption=True))
    client.restore_login("@askbot:example.org", "BRIDGE", "token")
    cross = _CrossSigning()
    crypto = Crypto(client, Store(tmp_path / "bridge.sqlite"), Encryption(trust="cross-signed"),
                    cross_signing=cross)  # type: ignore[arg-type]
    try:
        assert not crypto.devices_settled({PERSON})  # never queried
        cross.read.add(PERSON)
        # A look-up of her devices (a message's sender key) before they were read leaves nio's table an
        # empty entry for her: that is not having read them.
        assert client.device_store.device_from_sender_key(PERSON, "c") is None
        assert not crypto.devices_settled({PERSON})
        cross.read.discard(PERSON)
        client.device_store.add(OlmDevice(PERSON, "PHONE", {"ed25519": "e", "curve25519": "c"}))
        assert not crypto.devices_settled({PERSON})  # her cross-signing keys not read yet
        cross.read.add(PERSON)
        assert crypto.devices_settled({PERSON})
        client.olm.users_for_key_query.add(PERSON)  # her device list changed
        assert not crypto.devices_settled({PERSON})
    finally:
        await client.close()
