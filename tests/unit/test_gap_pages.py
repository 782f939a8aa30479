"""A limited sync's gap is read forward from the last token, a page at a
time, and the next page is asked for before the bridge judges this one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nio import RoomMessagesResponse

from helpers.fake_pages import RoomMessagesPages

from bridge.service.transport.bot import gap_pages
from bridge.service.transport.matrix import HttpReply, MatrixError, read_ahead
from bridge.service.transport.syncbatch import SyncBatch, Timeline


class _History(RoomMessagesPages):
    """A room with ``pages`` pages between the token ``s0`` and ``p9``."""

    user_id = "@askbot:example.org"

    def __init__(self, pages: int, log: list[str]):
        self.pages, self.log = pages, log

    async def room_messages(self, room_id, start, end, direction, limit, message_filter=None):
        self.log.append(f"ask {start} {direction}")
        n = 0 if start == "s0" else int(start[1:])
        if n == self.pages:
            return RoomMessagesResponse(room_id, chunk=[], start=start, end=None)
        assert end == "p9" and message_filter == {"not_senders": [self.user_id]}
        chunk = [SimpleNamespace(source={"event_id": f"$e{n}.{k}", "type": "m.room.message", "content": {}})
                 for k in range(2)]
        return RoomMessagesResponse(room_id, chunk=chunk, start=start, end=f"t{n + 1}")


def _limited(prev_batch: str) -> SyncBatch:
    return SyncBatch(next_batch="s9", timelines={"!r:example.org": Timeline([], True, prev_batch)})


async def test_the_gap_comes_oldest_first_and_each_page_is_judged_while_the_next_is_read():
    log: list[str] = []
    async for page in read_ahead(gap_pages(_History(3, log), _limited("p9"), "s0")):
        log.append("judge " + " ".join(event["event_id"] for event in page.events))
    assert log == ["ask s0 f", "ask t1 f", "judge $e0.0 $e0.1", "ask t2 f", "judge $e1.0 $e1.1",
                   "ask t3 f", "judge $e2.0 $e2.1"]


async def test_no_gap_without_a_token_or_a_limited_timeline():
    log: list[str] = []
    assert [page async for page in gap_pages(_History(3, log), _limited("p9"), None)] == []
    unlimited = _limited("p9")
    unlimited.timelines["!r:example.org"].limited = False
    assert [page async for page in gap_pages(_History(3, log), unlimited, "s0")] == []
    assert log == []


class _HiddenFirst(_History):
    """The first page's events all hidden from the bridge (said while it was
    out of a room whose history members see only from their join): an
    empty page, with an ``end`` to go on from."""

    async def room_messages(self, room_id, start, end, direction, limit, message_filter=None):
        page = await super().room_messages(room_id, start, end, direction, limit, message_filter)
        if start == "s0":
            return RoomMessagesResponse(room_id, chunk=[], start=start, end=page.end)
        return page


async def test_a_gap_is_read_on_past_a_page_hidden_from_the_bridge():
    log: list[str] = []
    pages = [page async for page in gap_pages(_HiddenFirst(3, log), _limited("p9"), "s0")]
    assert [event["event_id"] for page in pages for event in page.events] == ["$e1.0", "$e1.1", "$e2.0", "$e2.1"]


class _AlwaysEmpty(RoomMessagesPages):
    """A homeserver that answers every page empty, with a new ``end`` each time."""

    user_id = "@askbot:example.org"

    def __init__(self) -> None:
        self.asked = 0

    async def room_messages(self, room_id, start, end, direction, limit, message_filter=None):
        self.asked += 1
        return RoomMessagesResponse(room_id, chunk=[], start=start, end=f"t{self.asked}")


async def test_a_homeserver_answering_empty_pages_for_ever_holds_no_read_for_ever():
    from bridge.protocol.paging import EMPTY_PAGES_AT_MOST

    homeserver = _AlwaysEmpty()
    assert [page async for page in gap_pages(homeserver, _limited("p9"), "s0")] == []
    assert homeserver.asked == EMPTY_PAGES_AT_MOST


class _Refused(RoomMessagesPages):
    """``/messages`` refused for every room (``status``: its HTTP status)."""

    user_id = "@askbot:example.org"

    def __init__(self, status: int):
        self.status = status

    async def _send(self, response_class, method, path, response_data=()):
        return HttpReply(self.status, {"errcode": "M_FORBIDDEN" if self.status == 403 else "M_UNKNOWN",
                                       "error": "no"})


def _left(prev_batch: str) -> SyncBatch:
    room = "!r:example.org"
    return SyncBatch(next_batch="s9", timelines={room: Timeline([], True, prev_batch)}, left=frozenset({room}))


async def test_a_room_left_has_its_gap_read_up_to_where_its_timeline_starts():
    # (What was said before the bridge was put out, behind more than a
    # timeline of chatter, was never read.)
    log: list[str] = []
    pages = [page async for page in gap_pages(_History(2, log), _left("p9"), "s0")]
    assert [event["event_id"] for page in pages for event in page.events] == ["$e0.0", "$e0.1", "$e1.0", "$e1.1"]


async def test_a_room_left_whose_gap_the_homeserver_refuses_is_passed_over_and_a_joined_ones_is_not():
    assert [page async for page in gap_pages(_Refused(403), _left("p9"), "s0")] == []
    with pytest.raises(MatrixError):  # for now: the batch is tried again
        [page async for page in gap_pages(_Refused(502), _left("p9"), "s0")]
    with pytest.raises(MatrixError):
        [page async for page in gap_pages(_Refused(403), _limited("p9"), "s0")]
