"""After downtime, one acknowledgement per person and question (issue 20):
a person who changed their mind five times while the bridge was stopped
gets one reply, to the answer that stands, saying it replaces four."""

from __future__ import annotations

import asyncio
import time

import pytest

from helpers.attack import text_set
from helpers.harness import answer_content

pytestmark = pytest.mark.integration


async def the_only_reply(person, room: str, sent: list[str]) -> dict:
    """The one acknowledgement the bridge sends for any of ``sent``; fails on
    none within 30 s, or on more than one (two seconds more for a second)."""
    deadline = time.monotonic() + 30
    while not [n for e in sent for n in await person.notices_for(room, e)]:
        assert time.monotonic() < deadline, "no acknowledgement at all"
        await asyncio.sleep(0.3)
    await asyncio.sleep(2)  # anything more would come now
    replies = [n for e in sent for n in await person.notices_for(room, e)]
    assert len(replies) == 1, [r["content"]["body"] for r in replies]
    return replies[0]


async def test_five_answers_during_downtime_get_one_reply_for_the_last(bridge):
    bridge.add_set(text_set("minds", 2))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 2)
    assert bridge.stop() == 0
    alice, room = bridge.alice, bridge.room_id
    sent = [await alice.send(room, answer_content(questions[("q0", 1)], text=f"mind {n}")) for n in range(5)]
    other = await alice.send(room, answer_content(questions[("q1", 1)], text="only once"))
    bridge.start()
    record = await bridge.wait_answer("minds", "q0", rev=5, timeout=60)
    assert record["text"] == "mind 4"
    await alice.wait_notice(room, other, timeout=30)
    reply = await the_only_reply(alice, room, sent)
    outcome = reply["content"]["dev.superpipeline.question.outcome"]
    assert outcome["answer_event_id"] == sent[-1] and outcome["record_rev"] == record["rev"]
    assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent[-1]
    assert "mind 4" in reply["content"]["body"] and "replaces 4 earlier answers" in reply["content"]["body"]
    assert "replaces" not in (await alice.notices_for(room, other))[0]["content"]["body"]


async def test_a_gap_of_several_pages_is_judged_in_timeline_order_and_told_once(bridge):
    """A downtime longer than one sync's timeline: the gap is read and
    judged a page at a time, and still the answer that stands is the last
    one sent, and its person gets one reply for the answers on every page."""
    from bridge.service.transport.bot import GAP_PAGE, SYNC_FILTER

    bridge.add_set(text_set("pages", 1))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 1)
    assert bridge.stop() == 0
    alice, room = bridge.alice, bridge.room_id

    async def chatter(count: int, tag: str) -> None:
        for start in range(0, count, 25):  # their order among themselves does not matter
            await asyncio.gather(*(alice.send(room, {"msgtype": "m.text", "body": f"{tag} {n}"})
                                   for n in range(start, min(count, start + 25))))

    sent = []
    for n in range(3):  # one answer on each of the first pages of the gap
        sent.append(await alice.send(room, answer_content(questions[("q0", 1)], text=f"page {n}")))
        await chatter(GAP_PAGE, f"chatter {n}")
    await chatter(SYNC_FILTER["room"]["timeline"]["limit"], "after")
    bridge.start()
    record = await bridge.wait_answer("pages", "q0", rev=3, timeout=60)
    assert record["text"] == "page 2" and record["source"]["event_id"] == sent[-1]
    reply = await the_only_reply(alice, room, sent)
    assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent[-1]
    assert "replaces 2 earlier answers" in reply["content"]["body"]
    assert "filled a gap of" in bridge.log_text()
