"""An encrypted send reads the room's members from nio's view in place
after reading them: a join beside it (``MatrixTransport.join``) makes that
view anew, and members read from the view held before were none, so the
room key went to no one.  Seen as the first question of a room the bridge
joined at an invite staying unreadable to the person who invited it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nio.rooms import MatrixRoom

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store

ROOM, BOT, ALICE = "!room:example.org", "@askbot:example.org", "@alice:example.org"
CAROL = "@carol:example.org"


class _Client:
    user_id, device_id = BOT, "BRIDGE"
    olm = None
    store = None

    def __init__(self, state: list[dict[str, Any]] | None = None) -> None:
        self.rooms: dict[str, MatrixRoom] = {}
        self.encrypted_rooms = {ROOM}
        self.state = state or []  # the room's state events besides the joined members

    async def room_get_state(self, room_id: str) -> Any:
        return SimpleNamespace(events=self.state)

    async def joined_members(self, room_id: str) -> Any:
        # The invite's join ran while the members were asked for: nio's view
        # was made anew, and the answer went into the new one (nio's handler).
        await asyncio.sleep(0)
        room = self.rooms[room_id] = MatrixRoom(room_id, self.user_id, True)
        for user in (BOT, ALICE):
            room.add_member(user, None, None)
        room.members_synced = True


def _members_asked(crypto: Crypto) -> list[set[str]]:
    """The members each send asked about keys for (nothing is queried)."""
    asked: list[set[str]] = []

    def wanted(members: set[str]) -> bool:
        asked.append(members)
        return False

    async def maintain(only: set[str] | None = None) -> None:
        return None

    crypto._keys_wanted = wanted  # type: ignore[method-assign]
    crypto.maintain = maintain  # type: ignore[method-assign]
    crypto._maintain_behind = lambda: None  # type: ignore[method-assign]
    return asked


async def test_the_members_come_from_the_rooms_view_after_they_were_read(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    crypto = Crypto(_Client(), store, Encryption(trust="all"))  # type: ignore[arg-type]
    asked = _members_asked(crypto)
    try:
        assert await crypto.before_send(ROOM) is True
        assert asked == [{BOT, ALICE}]
    finally:
        store.close()


async def test_those_invited_get_the_room_keys_unless_the_history_is_the_joineds_only(tmp_path: Path) -> None:
    """Element shares room keys with the invited: someone invited just
    before questions were posted read none of them once they joined."""
    invite = {"type": "m.room.member", "state_key": CAROL, "content": {"membership": "invite"}}
    store = Store(tmp_path / "bridge.sqlite")
    try:
        for visibility, members in (("shared", {BOT, ALICE, CAROL}), ("invited", {BOT, ALICE, CAROL}),
                                    ("joined", {BOT, ALICE})):
            state = [invite, {"type": "m.room.history_visibility", "state_key": "",
                              "content": {"history_visibility": visibility}}]
            crypto = Crypto(_Client(state), store, Encryption(trust="all"))  # type: ignore[arg-type]
            asked = _members_asked(crypto)
            assert await crypto.before_send(ROOM) is True
            assert asked == [members], visibility
    finally:
        store.close()
