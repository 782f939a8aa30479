"""An invite whose answer fails for now is answered again (appservice mode:
the homeserver pushes an invite once, and no sync shows it again), and a
try that joined before it failed is finished, not passed over as joined."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.service.transport import invites as invites_module
from bridge.service.transport.invites import Invites
from bridge.service.transport.matrix import HttpReply, MatrixError

ROOM = "!room:example.org"
ALICE = "@alice:example.org"


class Homeserver:
    """The bridge's transport and client: ``fail`` names the calls answered
    502 (once each) or 403 (``refuse``, for good)."""

    def __init__(self, fail: set[str] = frozenset(), refuse: set[str] = frozenset()):
        self.fail, self.refuse = set(fail), set(refuse)
        self.joined: set[str] = set()
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.refuse:
            raise MatrixError(name, HttpReply(403, {"errcode": "M_FORBIDDEN", "error": "no"}))
        if name in self.fail:
            self.fail.discard(name)
            raise MatrixError(name, HttpReply(502, {"errcode": "M_UNKNOWN", "error": "try again later"}))

    async def joined_rooms(self) -> set[str]:
        return set(self.joined)

    async def join(self, room: str) -> str:
        self._call("join")
        self.joined.add(room)
        return room

    async def joined_members(self, room_id: str) -> set[str]:
        self._call("members")
        return {ALICE}

    async def room_leave(self, room_id: str) -> None:
        self._call("leave")


class Pipeline:
    def __init__(self, transport: Homeserver):
        self.transport = transport
        self.members: dict[str, set[str]] = {}
        self.removed: dict[str, Any] = {ROOM: "kicked"}

    async def load_members(self, room_id: str) -> None:
        self.members[room_id] = await self.transport.joined_members(room_id)


@pytest.fixture(autouse=True)
def no_waits(monkeypatch):
    monkeypatch.setattr(invites_module, "AGAIN_AFTER", (0.0, 0.0, 0.0))


def invites(homeserver: Homeserver, rooms: list[str]) -> tuple[Invites, Pipeline]:
    pipeline = Pipeline(homeserver)
    return Invites(homeserver, pipeline, rooms, [ROOM], None), pipeline


async def test_a_join_refused_for_now_is_asked_again_until_the_room_is_bridged():
    homeserver = Homeserver(fail={"join"})
    rooms: list[str] = []
    answering, pipeline = invites(homeserver, rooms)
    await answering.patiently(ROOM, ALICE)
    assert homeserver.calls == ["join", "join", "members"]
    assert rooms == [ROOM] and pipeline.members[ROOM] == {ALICE} and ROOM not in pipeline.removed


async def test_a_try_that_joined_and_then_failed_is_finished_not_passed_over_as_joined():
    homeserver = Homeserver(fail={"members"})
    rooms = [ROOM]  # the room it was kicked from
    answering, pipeline = invites(homeserver, rooms)
    await answering.patiently(ROOM, ALICE)
    # In the room after the first try: the second still reads its members.
    assert homeserver.calls == ["join", "members", "join", "members"]
    assert pipeline.members[ROOM] == {ALICE} and ROOM not in pipeline.removed
    assert answering.unfinished == set()


async def test_an_invite_sent_again_into_a_room_the_bridge_is_in_is_left_alone():
    homeserver = Homeserver()
    homeserver.joined.add(ROOM)
    answering, _pipeline = invites(homeserver, [ROOM])
    await answering.patiently(ROOM, ALICE)
    assert homeserver.calls == []


async def test_a_join_refused_for_good_is_not_asked_again(caplog):
    homeserver = Homeserver(refuse={"join"})
    answering, _pipeline = invites(homeserver, [])
    await answering.patiently(ROOM, ALICE)
    assert homeserver.calls == ["join"]
    assert "gave up" not in caplog.text


async def test_one_that_keeps_failing_is_given_up_and_said(caplog):
    homeserver = Homeserver()

    async def always_502(room: str) -> str:
        homeserver.calls.append("join")
        raise MatrixError("join", HttpReply(502, {"errcode": "M_UNKNOWN", "error": "down"}))

    homeserver.join = always_502  # type: ignore[method-assign]
    answering, _pipeline = invites(homeserver, [])
    await answering.patiently(ROOM, ALICE)
    assert homeserver.calls == ["join"] * 4
    assert "gave up answering the invite" in caplog.text


async def test_an_invite_into_a_room_the_bridge_is_in_is_not_declined_when_the_rooms_cant_be_listed():
    """A room no longer welcome (its invite sent again after a restart) that
    the bridge is in: the listing of its rooms failed for now, read as "in
    none", and the decline took the bridge out of the room."""
    homeserver = Homeserver()
    homeserver.joined.add(ROOM)
    listings = iter([RuntimeError("502"), None])

    async def listed_once_failing() -> set[str]:
        failure = next(listings, None)
        if failure is not None:
            raise failure
        return set(homeserver.joined)

    homeserver.joined_rooms = listed_once_failing  # type: ignore[method-assign]
    answering = Invites(homeserver, Pipeline(homeserver), [], [], None)  # not welcome here
    await answering.patiently(ROOM, "@stranger:example.org")
    assert "leave" not in homeserver.calls
