"""A limited sync's gap read back page by page keeps how far it got with each
page's commit: a stop (or a crash) in a gap of days of chatter left nothing
to say where the read was, and the next start read it all again from the
sync token (again after every stop, for ever if it was stopped often).
Now the next start goes on from the last page made durable: no event read
twice, none skipped, and the marks are forgotten once the token moves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from nio import RoomMessagesResponse

from helpers.fake_pages import RoomMessagesPages
from helpers.fake_sync import SyncBodies

from bridge.service.storage.store import Store
from bridge.service.transport.bot import SYNC_TOKEN, SyncLoop
from bridge.service.transport.gapread import GAP_AT, gaps_read, went_on_from

ROOM = "!room:example.org"
PAGES = 6


class _Homeserver(SyncBodies, RoomMessagesPages):
    """The sync from ``s0`` is cut short (its timeline begins at ``p9``); its
    gap holds ``PAGES`` pages of two answers; later syncs long-poll."""

    user_id = "@askbot:example.org"

    def __init__(self) -> None:
        self.read_from: list[str] = []  # the ``from`` of each page asked

    async def _send(self, response_class: Any, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        send = SyncBodies._send if "/sync" in path else RoomMessagesPages._send
        return await send(self, response_class, method, path, *args, **kwargs)

    async def sync_body(self, timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        if since == "s0":
            live = {"type": "m.room.message", "event_id": "$live", "sender": "@alice:example.org",
                    "origin_server_ts": 1, "content": {"msgtype": "m.text", "body": "live"}}
            return {"next_batch": "s9", "rooms": {"join": {ROOM: {"timeline": {
                "events": [live], "limited": True, "prev_batch": "p9"}}}}}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def room_messages(self, room_id, start, end, direction, limit, message_filter=None):
        self.read_from.append(start)
        n = 0 if start == "s0" else int(start[1:])
        assert end == "p9"
        if n == PAGES:
            return RoomMessagesResponse(room_id, chunk=[], start=start, end=None)
        chunk = [SimpleNamespace(source={"event_id": f"$e{n}.{k}", "type": "m.room.message",
                                         "sender": "@alice:example.org", "content": {}}) for k in range(2)]
        return RoomMessagesResponse(room_id, chunk=chunk, start=start, end=f"t{n + 1}")


class _Pipeline:
    """Judges by noting each event id; ``stop`` is set once ``stop_after`` events are durable."""

    def __init__(self, store: Store, judged: list[str], stop: asyncio.Event, stop_after: int | None = None):
        self.store, self.judged, self.stop, self.stop_after = store, judged, stop, stop_after
        self.batch_done = asyncio.Event()

    def own_users(self, user_id: str) -> bool:
        return False

    async def prepare(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return events

    def process(self, events: list[dict[str, Any]], *, commit: Any) -> None:
        with self.store.transaction():
            commit()
        self.judged.extend(event["event_id"] for event in events)
        if self.stop_after is not None and len(self.judged) >= self.stop_after:
            self.stop.set()
        if "$live" in self.judged:
            self.batch_done.set()

    def retry_held(self) -> bool:
        return False


async def _start(path: Path, homeserver: _Homeserver, judged: list[str], stop_after: int | None = None) -> Store:
    """One run of bot mode on the store at ``path``, until stopped (or its batch is durable)."""
    store = Store(path)
    stop = asyncio.Event()
    pipeline = _Pipeline(store, judged, stop, stop_after)
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    done = asyncio.ensure_future(pipeline.batch_done.wait())
    await asyncio.wait({loop, done}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    await asyncio.wait_for(loop, 10)
    done.cancel()
    return store


async def test_a_gap_read_stopped_half_way_goes_on_from_there_at_the_next_start(tmp_path: Path) -> None:
    path = tmp_path / "bridge.sqlite"
    store = Store(path)
    with store.transaction():
        store.set_meta(SYNC_TOKEN, "s0")
    store.close()
    judged: list[str] = []
    first = _Homeserver()
    (await _start(path, first, judged, stop_after=4)).close()  # stopped once two pages are durable
    durable = list(judged)
    assert "$live" not in durable and 4 <= len(durable) < 2 * PAGES  # the token did not move: the batch comes again
    again = _Homeserver()
    store = await _start(path, again, judged)
    # Read on from the page after the last one made durable, not from the sync token.
    assert again.read_from[0] == f"t{len(durable) // 2}", again.read_from
    everything = [f"$e{n}.{k}" for n in range(PAGES) for k in range(2)] + ["$live"]
    assert judged == everything  # each once, in timeline order, across the stop
    assert store.get_meta(SYNC_TOKEN) == "s9"
    assert store.meta_with_prefix(GAP_AT) == []  # the token is past the gap: its mark is forgotten
    store.close()


def test_a_mark_counts_only_for_a_read_from_the_same_token() -> None:
    read = gaps_read([(GAP_AT + ROOM, '["s0", "t3"]'), (GAP_AT + "!other:example.org", "not json")])
    assert read == {ROOM: ("s0", "t3")}  # one unreadable: its gap is read from its start
    assert went_on_from(read, ROOM, "s0") == "t3"
    assert went_on_from(read, ROOM, "s5") == "s5"  # a mark of a gap since left behind
    assert went_on_from(read, "!other:example.org", "s0") == "s0"
