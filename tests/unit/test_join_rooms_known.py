"""A restart does not join again the rooms the bridge is in: one list of its
rooms instead of a join each (a join costs the homeserver about a sync's
work, and at start it competes with the first sync; 200 rooms took 1.9 s of
joins before the first batch could be judged).  Rooms it is not in are
joined as before, and when the list can't be read every room is joined."""

from __future__ import annotations

import asyncio

from bridge.service.transport.rooms import RoomIds, join_rooms


class _Transport:
    def __init__(self, joined: set[str] | None):
        self.joined = joined
        self.joins: list[str] = []
        self.encryption_read: list[str] = []

    async def joined_rooms(self) -> set[str]:
        if self.joined is None:
            raise ConnectionError("the homeserver did not answer")
        return set(self.joined)

    async def join(self, room: str) -> str:
        self.joins.append(room)
        return "!aliased:example.org" if room.startswith("#") else room

    async def room_encrypted(self, room_id: str) -> bool:
        self.encryption_read.append(room_id)
        return False


def test_rooms_joined_already_are_not_joined_again() -> None:
    transport = _Transport({"!a:example.org", "!b:example.org"})
    ids = RoomIds()
    joined, refused = asyncio.run(join_rooms(transport, ["!a:example.org", "!b:example.org", "!c:example.org",
                                                         "#alias:example.org"], asyncio.Event(), ids))
    assert transport.joins == ["!c:example.org", "#alias:example.org"]
    assert joined == ["!a:example.org", "!b:example.org", "!c:example.org", "!aliased:example.org"]
    assert refused == []
    # A set configured with the alias is posted in the room it named (a message goes to a room id).
    assert ids.of("#alias:example.org") == "!aliased:example.org" and ids.of("!a:example.org") == "!a:example.org"
    # What a join teaches the transport (whether the room is encrypted) is learnt without it.
    assert transport.encryption_read == ["!a:example.org", "!b:example.org"]


def test_every_room_is_joined_when_the_list_cannot_be_read() -> None:
    transport = _Transport(None)
    joined, _refused = asyncio.run(join_rooms(transport, ["!a:example.org", "!b:example.org"], asyncio.Event()))
    assert transport.joins == ["!a:example.org", "!b:example.org"]
    assert joined == ["!a:example.org", "!b:example.org"]


def test_a_room_the_homeserver_keeps_failing_on_is_left_to_the_asking_behind_the_start() -> None:
    """A room the homeserver deleted answers M_UNKNOWN ("no servers") for
    ever: the start retried it without end, and no room was served."""
    from types import SimpleNamespace

    from bridge.service.transport.matrix import MatrixError

    class _Deleted(_Transport):
        async def join(self, room: str) -> str:
            self.joins.append(room)
            if room == "!gone:example.org":
                raise MatrixError(f"joining {room}", SimpleNamespace(
                    status_code="M_UNKNOWN", message="Can't join remote room because no servers are in the room"))
            return room

    transport = _Deleted(set())

    async def start() -> tuple[list[str], list[str]]:
        return await asyncio.wait_for(join_rooms(transport, ["!gone:example.org", "!ok:example.org"],
                                                 asyncio.Event()), 10)

    joined, refused = asyncio.run(start())
    assert (joined, refused) == (["!ok:example.org"], ["!gone:example.org"])
    assert transport.joins.count("!gone:example.org") == 3
