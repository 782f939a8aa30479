"""An encrypted send reads the room's members from nio's view in place
after reading them: a join beside it (``MatrixTransport.join``) makes that
view anew, and members read from the view held before were none, so the
room key went to no one.  Seen as the first question of a room the bridge
joined at an invite staying unreadable to the person who invited it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nio.rooms import MatrixRoom

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store

ROOM, BOT, ALICE = "!room:example.org", "@askbot:example.org", "@alice:example.org"


class _Client:
    user_id, device_id = BOT, "BRIDGE"
    olm = None
    store = None

    def __init__(self) -> None:
        self.rooms: dict[str, MatrixRoom] = {}
        self.encrypted_rooms = {ROOM}

    async def joined_members(self, room_id: str) -> Any:
        # The invite's join ran while the members were asked for: nio's view
        # was made anew, and the answer went into the new one (nio's handler).
        await asyncio.sleep(0)
        room = self.rooms[room_id] = MatrixRoom(room_id, self.user_id, True)
        for user in (BOT, ALICE):
            room.add_member(user, None, None)
        room.members_synced = True


async def test_the_members_come_from_the_rooms_view_after_they_were_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    crypto = Crypto(_Client(), store, Encryption(trust="all"))  # type: ignore[arg-type]
    asked: list[set[str]] = []

    def wanted(members: set[str]) -> bool:
        asked.append(members)
        return False

    async def maintain(only: set[str] | None = None) -> None:
        return None

    crypto._keys_wanted = wanted  # type: ignore[method-assign]
    crypto.maintain = maintain  # type: ignore[method-assign]
    crypto._maintain_behind = lambda: None  # type: ignore[method-assign]
    try:
        assert await crypto.before_send(ROOM) is True
        assert asked == [{BOT, ALICE}]
    finally:
        store.close()
