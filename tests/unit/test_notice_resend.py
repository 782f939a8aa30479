"""A crash between a notice's send and its mark: the next run sends exactly
that notice again (same transaction id, same answers told), not a new reply
that also counts answers the first one told."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

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
