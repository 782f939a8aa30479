"""Appservice mode's safety net without a homeserver: a transaction id that
skips one is looked into before it is handled, and a look at a room's
timeline feeds exactly what no transaction brought, oldest first, and
remembers where it ended."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from nio import MessageDirection, RoomMessagesResponse

from helpers.fake_pages import RoomMessagesPages
from helpers.waiting import until

from bridge.service.transport.appservice import TransactionServer
from bridge.service.transport import catchup as catchup_module
from bridge.service.transport.catchup import IDLE_LOOKS, TOKEN_KEY, CatchUp
from bridge.service.storage.store import Store
from test_appservice_endpoint import BEARER, ROOM, StandIn, config, event

BOT = "@askbot:example.org"


def message(n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "m.room.message", "event_id": f"$m{n}", "room_id": ROOM, "sender": "@p:example.org",
            "origin_server_ts": 1_000_000 + n, "content": {"msgtype": "m.text", "body": str(n)}, **extra}


class Timeline(RoomMessagesPages):
    """/messages over a fixed timeline, newest last; tokens are positions."""

    user_id = BOT

    def __init__(self, events: list[dict[str, Any]], hidden: Any = frozenset()):
        self.events = events
        self.hidden = hidden  # event ids left out of the pages, as Synapse hides what the bridge may not see
        self.calls: list[dict[str, Any]] = []

    async def room_messages(self, room_id: str, start: str | None = None, end: str | None = None,
                            direction: Any = None, limit: int = 10,
                            message_filter: dict[str, Any] | None = None) -> RoomMessagesResponse:
        self.calls.append({"start": start, "end": end, "limit": limit, "filter": message_filter})
        if direction in ("f", MessageDirection.front):  # oldest first, from ``start`` on
            first = int(start or 0)
            chunk = self.events[first:first + limit]
            reply = {"chunk": self._shown(chunk), "start": str(first),
                     **({"end": str(first + len(chunk))} if chunk else {})}
            return RoomMessagesResponse.from_dict(reply, room_id)
        top = int(start) if start else len(self.events)
        bottom = int(end) if end else 0
        chunk = list(reversed(self.events[max(bottom, top - limit):top]))
        reply = {"chunk": self._shown(chunk), "start": str(top)}
        if chunk:
            reply["end"] = str(top - len(chunk))
        return RoomMessagesResponse.from_dict(reply, room_id)

    def _shown(self, chunk: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The page is cut before what is hidden is left out: a page may be empty and not the last.
        return [e for e in chunk if e["event_id"] not in self.hidden]


class Fed:
    def __init__(self, store: Store):
        self.store = store
        self.batches: list[list[str]] = []
        self.members: list[str] = []

    async def feed(self, events: list[dict[str, Any]], commit: Any) -> None:
        self.batches.append([e["event_id"] for e in events])
        with self.store.transaction():
            for e in events:
                self.store.mark_processed(e["event_id"], "accepted")
            commit()

    async def on_members(self, room_id: str) -> None:
        self.members.append(room_id)


@pytest.fixture
def store(tmp_path: Path, store_backend: str):
    store = Store(tmp_path / "bridge.sqlite")
    yield store
    store.close()


def catchup(store: Store, timeline: Timeline, fed: Fed, received: set[str] = frozenset(), **kw: Any) -> CatchUp:
    return CatchUp(timeline, store, [ROOM], fed.feed, received.__contains__, fed.on_members,  # type: ignore[arg-type]
                   asyncio.Lock(), asyncio.Event(), **kw)


async def test_feeds_only_what_no_transaction_brought_oldest_first(store):
    timeline = Timeline([message(n) for n in range(1, 1201)])
    store.set_meta(TOKEN_KEY + ROOM, "100")  # the last look ended after $m100
    with store.transaction():
        store.mark_processed("$m150", "accepted")
    fed = Fed(store)
    looker = catchup(store, timeline, fed, received={"$m101", "$m1200"})

    assert await looker.sweep() == 1200 - 100 - 3
    assert fed.batches == [[f"$m{n}" for n in range(102, 1200) if n != 150]]
    assert store.get_meta(TOKEN_KEY + ROOM) == "1200"
    assert {call["end"] for call in timeline.calls} == {"100"}
    assert all(call["filter"] == {"not_senders": [BOT]} for call in timeline.calls)
    assert fed.members == []

    # Nothing new: nothing fed, one page asked for.
    timeline.calls.clear()
    assert await looker.sweep() == 0
    assert fed.batches == [[f"$m{n}" for n in range(102, 1200) if n != 150]]
    assert len(timeline.calls) == 1

    # A membership change among the missing ones: the members are asked for afresh.
    timeline.events.append({**message(1201), "type": "m.room.member", "state_key": "@q:example.org",
                            "content": {"membership": "join"}})
    assert await looker.sweep() == 1
    assert fed.members == [ROOM]


async def test_more_than_a_look_holds_is_read_forward_from_where_the_last_look_ended(store, monkeypatch):
    """The bot kicked, then an answer and more chatter than a look reads back
    (5,000 events): the look took the newest and moved its position past the
    rest, the answer among them never read, for good."""
    monkeypatch.setattr(catchup_module, "MAX_EVENTS", 50)
    monkeypatch.setattr(catchup_module, "PAGE", 20)
    timeline = Timeline([message(n) for n in range(1, 401)])
    store.set_meta(TOKEN_KEY + ROOM, "100")  # the last look ended after $m100
    fed = Fed(store)
    looker = catchup(store, timeline, fed, received={"$m400"})
    assert await looker.sweep() == 299
    assert [e for batch in fed.batches for e in batch] == [f"$m{n}" for n in range(101, 400)]
    assert max(len(batch) for batch in fed.batches) <= 20 and store.get_meta(TOKEN_KEY + ROOM) == "400"
    assert await looker.sweep() == 0  # nothing new


async def test_a_look_reads_forward_past_pages_hidden_from_the_bridge(store, monkeypatch):
    """Kicked from a room whose history members see only from their join,
    and invited back: what was said while it was out is hidden from it,
    pages of it empty, and the look read forward stopped at the first of
    them, the answers after its return unread (one page further each look)."""
    monkeypatch.setattr(catchup_module, "MAX_EVENTS", 50)
    monkeypatch.setattr(catchup_module, "PAGE", 20)
    timeline = Timeline([message(n) for n in range(1, 401)], hidden={f"$m{n}" for n in range(101, 301)})
    store.set_meta(TOKEN_KEY + ROOM, "100")  # the last look ended after $m100, before the kick
    fed = Fed(store)
    looker = catchup(store, timeline, fed, received={"$m400"})
    assert await looker.sweep() == 99
    assert [e for batch in fed.batches for e in batch] == [f"$m{n}" for n in range(301, 400)]
    assert store.get_meta(TOKEN_KEY + ROOM) == "400"


async def test_a_first_look_goes_back_to_the_oldest_open_question_or_only_takes_the_position(store):
    timeline = Timeline([message(n) for n in range(1, 11)])
    fed = Fed(store)
    assert await catchup(store, timeline, fed).sweep() == 0
    assert fed.batches == [] and store.get_meta(TOKEN_KEY + ROOM) == "10"

    # The oldest open question went out after $m5 (less the margin for clocks that disagree).
    store.db.execute("INSERT INTO posted(event_id, room_id, set_id, set_dir, qid, rev, elicitation_id, content,"
                     " posted_at) VALUES ('$q', ?, 's', '/s', 'q1', 1, 'el', '{}', ?)",
                     (ROOM, 1_000_000 + 6 + 10 * 60 * 1000))
    store.db.execute("DELETE FROM meta")
    assert await catchup(store, timeline, fed).sweep() == 5
    assert fed.batches == [["$m6", "$m7", "$m8", "$m9", "$m10"]]


@pytest.fixture
async def served(tmp_path, store_backend):
    store = Store(tmp_path / "bridge.sqlite")
    server = TransactionServer(config(tmp_path), store, StandIn(store))  # type: ignore[arg-type]
    server.open([ROOM], notices=None)  # type: ignore[arg-type]
    gaps: list[int] = []
    troubles: list[int] = []
    heard: list[int] = []
    held: list[set[str]] = []

    class Looker:
        async def look_now(self, arriving: set[str]) -> None:
            assert server.one_at_a_time.locked()  # no transaction is handled meanwhile
            gaps.append(len(stand_in.batches))  # how many transactions were handled before it
            held.append(arriving)  # the events of the transaction it holds up

        def suspect_gap(self) -> None:
            troubles.append(1)

        def heard(self) -> None:
            heard.append(1)

    stand_in = server.pipeline
    server.catchup = Looker()  # type: ignore[assignment]
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    yield client, server, gaps, troubles, heard, held
    await client.close()
    store.close()


async def test_a_transaction_id_that_skips_one_is_looked_into_first(served):
    client, server, gaps, troubles, heard, held = served

    async def put(txn_id: str, n: int, status: int = 200) -> None:
        response = await client.put(f"/_matrix/app/v1/transactions/{txn_id}", json={"events": [event(n)]},
                                    headers=BEARER)
        assert response.status == status

    await put("1", 1)
    await put("2", 2)
    assert troubles == []
    await put("2", 2)  # a resend
    assert gaps == []
    # The homeserver never had the 200 of it (it restarted, a proxy cut
    # it): what it queued meanwhile may be gone, so a look comes soon, not
    # at the next period (answers waited 20 s after a Synapse restart).
    assert troubles == [1]
    await put("4", 4)
    assert gaps == [2] and held == [{"$e4"}]  # the look came before transaction 4 was handled
    await put("3", 3)  # late: no new gap
    await put("abc", 5)  # not Synapse's numbering: nothing to tell
    await put("1", 7)  # a homeserver that counts from 1 again
    await put("2", 8)
    assert gaps == [2]
    await put("4", 9)
    assert gaps == [2, 7]
    assert {"$e1", "$e4", "$e9"} <= set(server.received)
    assert len(heard) == 9  # every transaction, the resend too: a burst of them delays the quiet look

    assert troubles == [1]
    server.pipeline.fail = OSError("disk full")
    await put("5", 10, status=500)
    assert troubles == [1, 1]  # a refused transaction: a look soon, off the request path


async def test_looks_before_transactions_are_held_to_a_few_in_ten_seconds(store):
    now = [100.0]
    fed = Fed(store)
    timeline = Timeline([message(n) for n in range(1, 3)])
    store.set_meta(TOKEN_KEY + ROOM, "1")
    looker = catchup(store, timeline, fed, clock=lambda: now[0])

    async def skipping(n: int) -> None:
        """A transaction holding message 100 + n skips an id; message n came in none (stranded)."""
        timeline.events += [message(n), message(100 + n)]
        await looker.look_now({f"$m{100 + n}"})

    for n in range(3, 6):
        await skipping(n)
        now[0] += 1
    assert fed.batches == [["$m2", "$m3", "$m103"], ["$m4", "$m104"], ["$m5", "$m105"]]
    assert not looker.suspected.is_set()
    await skipping(6)  # a fourth within ten seconds: left to the background look
    assert len(fed.batches) == 3 and looker.suspected.is_set()
    now[0] += 7
    await skipping(7)
    assert fed.batches[-1] == ["$m6", "$m106", "$m7", "$m107"]


async def test_skips_whose_looks_keep_finding_nothing_are_left_to_the_periodic_look(store):
    """Beside other appservices ids skip at every transaction: after three
    looks in a row found nothing, a skip holds no transaction up, until a
    look finds a stranded event or the bridge has trouble."""
    now = [100.0]
    fed = Fed(store)
    timeline = Timeline([message(1)])
    store.set_meta(TOKEN_KEY + ROOM, "1")
    received: set[str] = set()
    looker = catchup(store, timeline, fed, received, clock=lambda: now[0])

    async def looked() -> bool:
        """A skip: did the bridge read the timeline before the transaction?"""
        before = len(timeline.calls)
        await looker.look_now()
        now[0] += 20  # never the burst limit
        return len(timeline.calls) > before

    assert [await looked() for _ in range(4)] == [True, True, True, False]
    assert fed.batches == []
    timeline.events += [message(2), message(3)]
    received.add("$m3")
    assert await looker.sweep() == 1  # the periodic look finds a stranded event: skips count again
    assert [await looked() for _ in range(4)] == [True, True, True, False]
    looker.suspect_gap()  # a refused transaction: the homeserver may strand the next one
    assert await looked()


async def test_the_held_transactions_own_events_and_later_ones_are_not_stranded(store):
    """A look before a transaction finds that transaction's events in the
    timeline (and, on a busy room, events sent after them): they are on
    their way, not stranded.  Beside other appservices, whose transactions
    share the numbering, every transaction skips an id; counting those as
    stranded made every look find something, so each skip held its
    transaction up by a look, never left to the periodic one."""
    now = [100.0]
    fed = Fed(store)
    timeline = Timeline([message(1)])
    store.set_meta(TOKEN_KEY + ROOM, "1")
    looker = catchup(store, timeline, fed, clock=lambda: now[0])

    async def looked(n: int, stranded: int = 0) -> bool:
        """Transaction ``n`` (message n, with message n + 1 sent meanwhile)
        skips an id; ``stranded`` messages before it came in none."""
        timeline.events += [message(n - k) for k in range(stranded, 0, -1)] + [message(n), message(n + 1)]
        before = len(timeline.calls)
        await looker.look_now({f"$m{n}"})
        now[0] += 20  # never the burst limit
        return len(timeline.calls) > before

    # One that came before the held transaction's, and in no transaction, is stranded.
    assert await looked(20, stranded=2) and looker.idle_looks == 0
    assert [await looked(n) for n in (30, 40, 50, 60)] == [True, True, True, False]
    assert fed.batches == [["$m18", "$m19", "$m20", "$m21"], ["$m30", "$m31"], ["$m40", "$m41"],
                           ["$m50", "$m51"]]  # what the look finds is fed oldest first, as before
    # The periodic look, holding no transaction up, finds the newest (60, 61, 70) on their way,
    # none followed by one that came: nothing stranded.
    timeline.events.append(message(70))
    assert await looker.sweep() == 3 and looker.idle_looks == IDLE_LOOKS


async def test_a_failed_look_before_a_transaction_is_tried_again_off_the_request_path(store):
    class Broken(Timeline):
        async def room_messages(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError("the homeserver went away")

    looker = catchup(store, Broken([]), Fed(store))
    await looker.look_now()
    assert looker.suspected.is_set()


async def test_after_start_it_looks_again_once_the_homeservers_retries_went_quiet(store, monkeypatch):
    monkeypatch.setattr(catchup_module, "GAP_DELAY", 1.0)
    monkeypatch.setattr(catchup_module, "PERIOD", 600)
    timeline = Timeline([message(n) for n in range(1, 4)])
    store.set_meta(TOKEN_KEY + ROOM, "3")
    looker = catchup(store, timeline, Fed(store))
    running = asyncio.ensure_future(looker.run())
    try:
        await until(lambda: len(timeline.calls) == 1)
        busy_until = time.monotonic() + 1.5
        while time.monotonic() < busy_until:  # transactions keep coming: no look yet
            looker.heard()
            await asyncio.sleep(0.01)
        assert len(timeline.calls) == 1
        await until(lambda: len(timeline.calls) == 2)
    finally:
        looker.stop.set()
        await running


until = partial(until, timeout=5, every=0.01)
async def test_until_a_transaction_comes_after_start_it_looks_every_second_or_two(store, monkeypatch):
    # A new leader: the homeserver's one transaction in flight went to the
    # instance that froze, and nothing is pushed here yet.
    monkeypatch.setattr(catchup_module, "FAST_PERIOD", 0.2, raising=False)
    monkeypatch.setattr(catchup_module, "GAP_DELAY", 0.1)
    monkeypatch.setattr(catchup_module, "PERIOD", 600)
    timeline = Timeline([message(n) for n in range(1, 4)])
    store.set_meta(TOKEN_KEY + ROOM, "3")
    fed = Fed(store)
    looker = catchup(store, timeline, fed)
    running = asyncio.ensure_future(looker.run())
    try:
        await until(lambda: len(timeline.calls) >= 3)
        timeline.events.append(message(4))  # an answer no transaction brings
        await until(lambda: fed.batches == [["$m4"]], timeout=2)
        looker.heard()  # the homeserver pushes again: back to the slow period
        await asyncio.sleep(0.5)
        calls = len(timeline.calls)
        await asyncio.sleep(1.0)
        assert len(timeline.calls) == calls
    finally:
        looker.stop.set()
        await running


def test_a_timeline_page_the_homeserver_refuses_says_the_homeservers_reason():
    # nio's error type needs the room: every refused read (M_FORBIDDEN once
    # the bot is out of the room, a 5xx) became a TypeError in the logs.
    from nio import RoomMessagesError

    from bridge.service.transport.matrix import TimelinePage

    refused = TimelinePage.from_dict({"errcode": "M_FORBIDDEN", "error": "You are not in the room"}, "!r:hs")
    assert isinstance(refused, RoomMessagesError)
    assert refused.status_code == "M_FORBIDDEN" and refused.message == "You are not in the room"


async def test_an_invite_back_into_a_room_brings_a_look_soon(served):
    # Kicked, then invited back: what people said meanwhile is in the room's
    # timeline, never pushed; it waited for the next periodic look (24 s).
    from types import SimpleNamespace

    client, server, _gaps, troubles, _heard, _held = served
    server.pipeline.transport = SimpleNamespace(user_id="@askbot:example.org")
    joined: list[str] = []

    async def on_invite(room_id: str, _inviter: str | None) -> None:
        joined.append(room_id)

    server.on_invite = on_invite
    invite = {"type": "m.room.member", "state_key": "@askbot:example.org", "event_id": "$inv", "room_id": ROOM,
              "sender": "@p:example.org", "origin_server_ts": 1, "content": {"membership": "invite"}}
    response = await client.put("/_matrix/app/v1/transactions/1", json={"events": [invite]}, headers=BEARER)
    assert response.status == 200
    await until(lambda: troubles == [1], timeout=5)
    assert joined == [ROOM]


async def test_a_look_asks_the_store_what_it_processed_in_one_job_off_the_event_loop(store):
    """Each event a look found was checked with a statement of its own on
    the event loop: 11 held /health 1.1 s with the database 100 ms away."""
    from helpers.loopwatch import statements_on_the_loop

    timeline = Timeline([message(n) for n in range(1, 12)])
    store.set_meta(TOKEN_KEY + ROOM, "0")
    with store.transaction():
        store.mark_processed("$m5", "accepted")
    fed = Fed(store)
    looker = catchup(store, timeline, fed)
    on_loop = statements_on_the_loop(store)
    assert await looker.sweep() == 10
    assert [s for s in on_loop if s.startswith("SELECT")] == []


async def test_a_room_the_bridge_cant_read_stops_no_look_into_the_rooms_after_it(store):
    """Banned from (or losing to deletion) its first room, every look failed
    on it, and the rooms after it were never read: an answer there stayed
    unjudged (90 s and counting, a warning every 1.5 s)."""
    from nio import RoomMessagesError

    class Banned(Timeline):
        async def room_messages(self, room_id, *args, **kwargs):
            if room_id == "!banned:example.org":
                return RoomMessagesError("You don't have permission to access that room.", "M_FORBIDDEN")
            return await super().room_messages(room_id, *args, **kwargs)

    store.set_meta(TOKEN_KEY + ROOM, "0")
    store.set_meta(TOKEN_KEY + "!banned:example.org", "0")
    fed = Fed(store)
    looker = CatchUp(Banned([message(1), message(2)]), store, ["!banned:example.org", ROOM], fed.feed,
                     set().__contains__, fed.on_members, asyncio.Lock(), asyncio.Event())
    assert await looker.sweep() == 2
    assert fed.batches == [["$m1", "$m2"]]


async def test_the_periodic_look_lets_transactions_in_between_rooms(store):
    """The periodic look held the transactions' lock while it read every
    room's timeline: with thousands of rooms (or a slow federated /messages)
    a transaction waited past the proxy's timeout, and Synapse marked the
    bridge down for minutes."""
    rooms = [f"!room{n}:example.org" for n in range(4)]

    class Slow(Timeline):
        async def room_messages(self, room_id: str, *args: Any, **kwargs: Any) -> RoomMessagesResponse:
            await asyncio.sleep(0.2)
            return await super().room_messages(room_id, *args, **kwargs)

    timeline, fed, lock, stop = Slow([message(1)]), Fed(store), asyncio.Lock(), asyncio.Event()
    for room in rooms:
        store.set_meta(TOKEN_KEY + room, "0")
    looker = CatchUp(timeline, store, rooms, fed.feed, frozenset().__contains__, fed.on_members,  # type: ignore[arg-type]
                     lock, stop)
    looking = asyncio.ensure_future(looker.run())
    try:
        await until(lambda: timeline.calls, what="the look never began")
        async with lock:  # a transaction comes while the look is under way
            rooms_read_by_then = len(timeline.calls)
        await until(lambda: looker.looked.is_set(), what="the look never ended")
        assert rooms_read_by_then < len(rooms) <= len(timeline.calls)
    finally:
        stop.set()
        await looking
