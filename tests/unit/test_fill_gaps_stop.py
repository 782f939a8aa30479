"""A stop asked for during a long back-fill ends it before the next page,
without handling the batch (so the sync token stays where it was)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from nio import RoomMessagesResponse

from helpers.fake_pages import RoomMessagesPages

from bridge.service.transport.bot import StopRequested, gap_pages
from bridge.service.transport.syncbatch import SyncBatch, Timeline


class _EndlessHistory(RoomMessagesPages):
    """A room whose history pages never end; a stop arrives with the first page."""

    def __init__(self, stop: asyncio.Event):
        self.stop = stop
        self.pages = 0

    user_id = "@askbot:example.org"

    async def room_messages(self, room_id, start, end, direction, limit, message_filter=None):
        self.pages += 1
        self.stop.set()
        event = SimpleNamespace(source={"event_id": f"$e{self.pages}", "type": "m.room.message", "content": {}})
        return RoomMessagesResponse(room_id, chunk=[event], start=start, end=f"{start}x")


async def test_a_stop_during_a_back_fill_ends_it_before_the_next_page():
    stop = asyncio.Event()
    client = _EndlessHistory(stop)
    response = SyncBatch(next_batch="s1", timelines={"!r": Timeline([], True, "p1")})
    with pytest.raises(StopRequested):
        async for _page in gap_pages(client, response, "s0", stop):
            pass
    assert client.pages == 1
