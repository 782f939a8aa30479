"""A crash between a notice's send and its mark: the next run sends exactly
that notice again (same transaction id, same answers told), not a new reply
that also counts answers the first one told."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bridge.service.answering.notices import Notices
from helpers.timeline import Room, answer

ALICE = "@alice:hs"


class Killed(BaseException):
    """The process died right after the homeserver took the event."""


class HomeserverThenKill:
    """Takes the event as a homeserver does (a repeated transaction id gets the
    event it already has), then dies before the bridge hears back."""

    def __init__(self, inner: Any, events: dict[str, dict[str, Any]], die: bool) -> None:
        self.inner, self.events, self.die = inner, events, die
        self.user_id = inner.user_id

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        self.events.setdefault(txn_id, content)
        if self.die:
            raise Killed()
        return f"$notice-{txn_id}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _pass(room: Room, events: dict[str, dict[str, Any]], die: bool) -> None:
    room.pipeline.transport = HomeserverThenKill(room.pipeline.transport, events, die)
    try:
        asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    except Killed:
        pass


def test_a_notice_cut_off_by_a_crash_is_sent_again_as_it_was(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a1", ALICE, 1, "main"), answer("$a2", ALICE, 2, "stable")])
    timeline: dict[str, dict[str, Any]] = {}
    _pass(room, timeline, die=True)  # the reply for $a2 (replacing $a1) is in the room; the mark is lost
    room.crash()
    room.deliver([answer("$a3", ALICE, 3, "main")])
    _pass(room, timeline, die=False)
    told = [content["dev.superpipeline.question.outcome"]["answer_event_id"] for content in timeline.values()]
    assert sorted(told) == ["$a2", "$a3"]
    bodies = {content["dev.superpipeline.question.outcome"]["answer_event_id"]: content["body"]
              for content in timeline.values()}
    assert "replaces 1 earlier answer" in bodies["$a2"] or "replaces your earlier answer" in bodies["$a2"]
    # $a3 replaces only the answer told just before: $a1 was told within $a2's reply.
    assert "earlier answers" not in bodies["$a3"]
    assert room.store.meta_with_prefix("notice-sending:") == []


def test_answers_read_out_of_the_rooms_order_get_one_reply_for_the_one_that_stands(tmp_path: Path) -> None:
    """One transaction held two answers of Alice's, the later one (in the
    room) first: the record kept the later, but the one reply named the
    other, the last read ("Recorded … The main branch. This replaces 1
    earlier answer …")."""
    room = Room(tmp_path)
    room.deliver([answer("$later", ALICE, 2, "stable"), answer("$earlier", ALICE, 1, "main")])
    assert room.record()["choice"] == "stable"
    timeline: dict[str, dict[str, Any]] = {}
    _pass(room, timeline, die=False)
    (reply,) = timeline.values()
    assert reply["dev.superpipeline.question.outcome"]["answer_event_id"] == "$later"
    assert "The stable branch" in reply["body"] and "1 earlier answer" in reply["body"], reply["body"]


class Away:
    """A homeserver that is not there (a proxy's 502, a refused connection) until it is back."""

    def __init__(self, inner: Any, error: BaseException) -> None:
        self.inner, self.error, self.back, self.sent = inner, error, False, []
        self.user_id = inner.user_id

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if not self.back:
            raise self.error
        self.sent.append(content)
        return f"$notice-{txn_id}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _gone(status: str | None) -> BaseException:
    from bridge.service.transport.matrix import MatrixError

    return ConnectionRefusedError("connection refused") if status is None else \
        MatrixError("sending m.room.message", type("R", (), {"status_code": status, "message": "x"})())


@pytest.mark.parametrize("status", [None, "M_UNKNOWN"], ids=["no answer", "a proxy's 502"])
def test_notices_held_back_while_the_homeserver_was_away_go_as_soon_as_it_answers(tmp_path: Path, status) -> None:
    """Through a 70 s outage the room's backoff doubled to 32 s, then 64 s
    (up to 5 minutes): the answers that came once it was back were recorded,
    and their acknowledgements waited out the backoff, nearly a minute."""
    room = Room(tmp_path)
    now = [0.0]
    away = Away(room.pipeline.transport, _gone(status))
    room.pipeline.transport = away
    notices = Notices(room.pipeline, asyncio.Event(), clock=lambda: now[0])
    room.deliver([answer("$a1", ALICE, 1, "main")])
    for _ in range(8):  # tried again and again through the outage
        now[0] = max(now[0], notices.room_retry.get("!room:hs", (0.0, 0.0))[0])
        assert asyncio.run(notices.send_pending()) == 0
    assert notices.room_retry["!room:hs"][1] >= 60
    away.back = True
    notices.homeserver_answered()  # its next sync (or transaction) came
    assert asyncio.run(notices.send_pending()) == 1
    assert [c["dev.superpipeline.question.outcome"]["answer_event_id"] for c in away.sent] == ["$a1"]


def test_a_room_rate_limiting_the_bridge_keeps_its_backoff_when_the_homeserver_answers(tmp_path: Path) -> None:
    room = Room(tmp_path)
    away = Away(room.pipeline.transport, _gone("M_LIMIT_EXCEEDED"))
    room.pipeline.transport = away
    notices = Notices(room.pipeline, asyncio.Event(), clock=lambda: 0.0)
    room.deliver([answer("$a1", ALICE, 1, "main")])
    assert asyncio.run(notices.send_pending()) == 0
    away.back = True
    notices.homeserver_answered()
    assert asyncio.run(notices.send_pending()) == 0  # its backoff stands: the room asked for it
