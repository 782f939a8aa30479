"""Invites answered until answered for good: a join that fails for now is
tried again, one refused for good is dropped, a withdrawn invite is not
tried again, and an invite kept in the store is answered by the next start.
(Against a real Synapse: tests/integration/test_invites_retried.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from nio import SyncResponse

from bridge.service.storage.store import Store
from bridge.service.transport import invites as invites_module
from bridge.service.transport.bot import SYNC_TOKEN, prime_sync_token
from bridge.service.transport.invites import INVITED, Invites, keep_invites, kept_invites, membership_news
from bridge.service.transport.matrix import HttpReply, MatrixError
from helpers.waiting import until

BOT = "@askbot:example.org"
ROOM = "!room:example.org"
ALICE = "@alice:example.org"


class Transport:
    """Joins answered by ``replies`` in turn (a status: 200 joins, else a MatrixError of that status)."""

    user_id = BOT

    def __init__(self, *replies: int):
        self.replies = list(replies)
        self.joins = 0
        self.rooms: set[str] = set()

    async def joined_rooms(self) -> set[str]:
        return set(self.rooms)

    async def join(self, room: str) -> str:
        self.joins += 1
        status = self.replies.pop(0) if self.replies else 200
        if status != 200:
            raise MatrixError(f"joining {room}", HttpReply(status, {"errcode": "M_FORBIDDEN" if status == 403
                                                                     else "M_UNKNOWN", "error": "no"}))
        self.rooms.add(room)
        return room


@pytest.fixture
def store(tmp_path: Path, store_backend: str):
    store = Store(tmp_path / "bridge.sqlite")
    yield store
    store.close()


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(invites_module, "RETRY_FIRST", 0.01)


def invites(store: Store, transport: Transport) -> Invites:
    async def load_members(_room: str) -> None:
        return None

    pipeline = SimpleNamespace(transport=transport, removed={}, load_members=load_members)
    return Invites(SimpleNamespace(), pipeline, [], [ROOM], None, store=store)


def kept(store: Store, room: str = ROOM, inviter: str = ALICE) -> None:
    with store.transaction():
        keep_invites(store, {room: inviter}, [])


async def test_a_join_that_fails_for_now_is_tried_again_until_in_and_then_forgotten(store):
    transport = Transport(502, 502)
    answering = invites(store, transport)
    kept(store)
    await answering.answer(ROOM, ALICE)
    await until(lambda: ROOM in transport.rooms, timeout=5, what="joined")
    await until(lambda: kept_invites(store) == {}, timeout=5, what="forgotten once joined")
    assert transport.joins == 3 and answering.rooms == [ROOM]
    await answering.close()


async def test_a_join_refused_for_good_is_not_tried_again(store):
    transport = Transport(403)
    answering = invites(store, transport)
    kept(store)
    await answering.answer(ROOM, ALICE)
    await asyncio.sleep(0.1)
    assert transport.joins == 1 and kept_invites(store) == {}
    await answering.close()


async def test_a_withdrawn_invite_is_not_tried_again(store):
    transport = Transport(*[502] * 100)
    answering = invites(store, transport)
    await answering.answer(ROOM, ALICE)
    answering.ended([ROOM])
    await asyncio.sleep(0.1)
    tries = transport.joins
    await asyncio.sleep(0.1)
    assert tries <= 2 and transport.joins == tries
    await answering.close()


async def test_an_invite_kept_unanswered_is_answered_at_the_start(store):
    transport = Transport()
    kept(store)
    answering = invites(store, transport)
    await answering.resume()
    await until(lambda: ROOM in transport.rooms and not store.meta_with_prefix(INVITED), timeout=5, what="joined")
    await answering.close()


def member(room: str, membership: str, sender: str = ALICE, user: str = BOT) -> dict[str, Any]:
    return {"type": "m.room.member", "room_id": room, "state_key": user, "sender": sender,
            "content": {"membership": membership}}


def test_a_transactions_invites_and_the_invites_it_ends():
    events = [member("!a:hs", "invite"), member("!b:hs", "invite"), member("!b:hs", "leave"),
              member("!c:hs", "ban"), member("!c:hs", "invite", sender="@bob:hs"), member("!d:hs", "invite", user=ALICE),
              {"type": "m.room.message", "room_id": "!e:hs", "content": {}}]
    assert membership_news(events, BOT) == ({"!a:hs": ALICE, "!c:hs": "@bob:hs"}, ["!b:hs"])


async def test_an_invite_into_a_room_the_bridge_is_in_is_not_declined_when_the_rooms_cant_be_listed(store):
    """A room no longer welcome (its invite sent again after a restart) that
    the bridge is in: the listing of its rooms failed for now, read as "in
    none", and the decline took the bridge out of the room."""
    transport = Transport()
    transport.rooms.add(ROOM)
    listings = iter([RuntimeError("502")])
    left: list[str] = []

    async def listed_once_failing() -> set[str]:
        failure = next(listings, None)
        if failure is not None:
            raise failure
        return set(transport.rooms)

    async def room_leave(room: str) -> None:
        left.append(room)

    transport.joined_rooms = listed_once_failing  # type: ignore[method-assign]
    pipeline = SimpleNamespace(transport=transport, removed={}, load_members=None)
    answering = Invites(SimpleNamespace(room_leave=room_leave), pipeline, [], [], None, store=store)  # not welcome
    await answering.answer(ROOM, "@stranger:example.org")
    await asyncio.sleep(0.1)
    assert left == []
    await answering.close()


class _FirstStart:
    """A homeserver whose first sync (no token yet) shows an invite alice sent before the bridge ever ran."""

    user_id = BOT

    async def sync(self, timeout: int, sync_filter: Any) -> Any:
        return SyncResponse.from_dict({"next_batch": "s1", "rooms": {"invite": {ROOM: {"invite_state": {"events": [
            {"type": "m.room.create", "state_key": "", "sender": ALICE, "content": {}},
            {"type": "m.room.member", "state_key": BOT, "sender": ALICE, "content": {"membership": "invite"}}]}}}}})


async def test_an_invite_sent_before_the_first_start_is_answered_by_it(store):
    """The usual order (invite the bot, then start it): the first sync's
    invites were passed over and only its token kept; no sync after it
    shows them again, so the bridge never joined."""
    await prime_sync_token(_FirstStart(), store)
    assert store.get_meta(SYNC_TOKEN) == "s1"
    assert kept_invites(store) == {ROOM: ALICE}
    transport = Transport()
    answering = invites(store, transport)
    await answering.resume()
    await until(lambda: ROOM in transport.rooms and not store.meta_with_prefix(INVITED), timeout=5, what="joined")
    await answering.close()
