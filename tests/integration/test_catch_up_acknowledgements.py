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
    deadline = time.monotonic() + 30
    while not (replies := [n for e in sent for n in await alice.notices_for(room, e)]):
        assert time.monotonic() < deadline, "no acknowledgement at all"
        await asyncio.sleep(0.3)
    await asyncio.sleep(2)  # anything more would come now
    replies = [n for e in sent for n in await alice.notices_for(room, e)]
    assert len(replies) == 1, [r["content"]["body"] for r in replies]
    [reply] = replies
    outcome = reply["content"]["dev.superpipeline.question.outcome"]
    assert outcome["answer_event_id"] == sent[-1] and outcome["record_rev"] == record["rev"]
    assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent[-1]
    assert "mind 4" in reply["content"]["body"] and "replaces 4 earlier answers" in reply["content"]["body"]
    assert "replaces" not in (await alice.notices_for(room, other))[0]["content"]["body"]
