"""nio reads none of the rooms' events (the bridge reads them, in both
modes), so ``Crypto.note_events`` tells it what they say, on a real
matrix-nio client with its olm machine: a room whose encryption is turned on
gets nothing in the clear from then on (nor after a restart), and a member
joining or leaving an encrypted room has its members read again under a new
room key before the next send (a plain room's are left alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nio import AsyncClient
from nio.rooms import MatrixRoom

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import client_config

BOT, PERSON = "@askbot:example.org", "@person:example.org"
ROOM, PLAIN = "!room:example.org", "!plain:example.org"


def _client(folder: Path) -> AsyncClient:
    folder.mkdir(exist_ok=True)
    client = AsyncClient("http://127.0.0.1:1", BOT, store_path=str(folder), config=client_config(encryption=True))
    client.restore_login(BOT, "BRIDGE", "token")  # loads the key store, and the rooms it knows are encrypted
    return client


def _state(kind: str, state_key: str, content: dict[str, Any], sender: str = PERSON) -> dict[str, Any]:
    return {"type": kind, "state_key": state_key, "content": content, "room_id": ROOM, "sender": sender,
            "event_id": f"${kind}{state_key}", "origin_server_ts": 1}


class _Reads:
    """Which rooms' members nio was asked for."""

    def __init__(self, client: AsyncClient) -> None:
        self.rooms: list[str] = []
        client.joined_members = self.read  # type: ignore[method-assign]
        client.room_get_state = self.state  # type: ignore[method-assign]

    async def read(self, room_id: str) -> None:
        self.rooms.append(room_id)

    async def state(self, room_id: str) -> Any:
        return None  # (no invitations known: the joined members only)


async def test_encryption_turned_on_in_a_known_room_is_kept_from_then_on(tmp_path: Path) -> None:
    client = _client(tmp_path / "keys")
    crypto = Crypto(client, Store(tmp_path / "bridge.sqlite"), Encryption())
    try:
        room = client.rooms[ROOM] = MatrixRoom(ROOM, BOT, False)  # known, in the clear, members read
        room.members_synced = True
        reads = _Reads(client)
        # Not a state event, or no algorithm: nothing changes.
        crypto.note_events([{**_state("m.room.encryption", "", {"algorithm": "m.megolm.v1.aes-sha2"}),
                             "state_key": None},
                            _state("m.room.encryption", "", {})])
        assert not room.encrypted and ROOM not in client.encrypted_rooms
        crypto.note_events([_state("m.room.encryption", "", {"algorithm": "m.megolm.v1.aes-sha2"}, sender=BOT)])
        assert room.encrypted and ROOM in client.encrypted_rooms
        await crypto.read_changed_members()  # its members' devices get the first room key
        assert reads.rooms == [ROOM]
    finally:
        await client.close()
    again = _client(tmp_path / "keys")  # the next start knows without asking the homeserver
    try:
        assert ROOM in again.encrypted_rooms
        assert (await Crypto(again, Store(tmp_path / "bridge.sqlite"), Encryption()).ensure_room(ROOM)).encrypted
    finally:
        await again.close()


async def test_a_member_joining_or_leaving_an_encrypted_room_has_its_members_read_again_under_a_new_key(tmp_path: Path) -> None:
    client = _client(tmp_path / "keys")
    crypto = Crypto(client, Store(tmp_path / "bridge.sqlite"), Encryption())
    try:
        client.rooms[ROOM] = MatrixRoom(ROOM, BOT, True)
        client.encrypted_rooms.add(ROOM)  # as ``ensure_room`` leaves it
        client.rooms[PLAIN] = MatrixRoom(PLAIN, BOT, False)
        reads = _Reads(client)
        invalidated: list[str] = []
        client.invalidate_outbound_session = invalidated.append  # type: ignore[method-assign]
        crypto.note_events([{"type": "m.room.message", "room_id": ROOM, "sender": PERSON, "content": {}},
                            {**_state("m.room.member", PERSON, {"membership": "join"}), "room_id": PLAIN}])
        await crypto.read_changed_members()
        assert reads.rooms == [] and invalidated == []  # nothing is encrypted for a plain room's members
        crypto.note_events([_state("m.room.member", PERSON, {"membership": "leave"})])
        assert invalidated == [ROOM]
        await crypto.read_changed_members()
        assert reads.rooms == [ROOM]
    finally:
        await client.close()


async def test_the_historys_visibility_changed_in_an_encrypted_room_is_a_new_room_key(tmp_path: Path) -> None:
    """Switched to "joined": the invited kept the room key they were given
    and read every later question (13 of 13), where docs/encryption.md says
    only the joined get the keys then."""
    client = _client(tmp_path / "keys")
    crypto = Crypto(client, Store(tmp_path / "bridge.sqlite"), Encryption())
    try:
        client.rooms[ROOM] = MatrixRoom(ROOM, BOT, True)
        client.encrypted_rooms.add(ROOM)
        reads = _Reads(client)
        invalidated: list[str] = []
        client.invalidate_outbound_session = invalidated.append  # type: ignore[method-assign]
        crypto.note_events([_state("m.room.history_visibility", "", {"history_visibility": "joined"}, sender=BOT)])
        assert invalidated == [ROOM]
        await crypto.read_changed_members()
        assert reads.rooms == [ROOM]
    finally:
        await client.close()
