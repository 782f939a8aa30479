"""After downtime, one acknowledgement per person and question (issue 20):
a person who changed their mind five times while the bridge was stopped
gets one reply, to the answer that stands, saying it replaces four."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest

from helpers.attack import text_set
from helpers.harness import answer_content, hooked

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


async def chatter(person, room: str, count: int, tag: str) -> None:
    for start in range(0, count, 25):  # their order among themselves does not matter
        await asyncio.gather(*(person.send(room, {"msgtype": "m.text", "body": f"{tag} {n}"})
                               for n in range(start, min(count, start + 25))))


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
    sent = []
    for n in range(3):  # one answer on each of the first pages of the gap
        sent.append(await alice.send(room, answer_content(questions[("q0", 1)], text=f"page {n}")))
        await chatter(alice, room, GAP_PAGE, f"chatter {n}")
    await chatter(alice, room, SYNC_FILTER["room"]["timeline"]["limit"], "after")
    bridge.start()
    record = await bridge.wait_answer("pages", "q0", rev=3, timeout=60)
    assert record["text"] == "page 2" and record["source"]["event_id"] == sent[-1]
    reply = await the_only_reply(alice, room, sent)
    assert reply["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent[-1]
    assert "replaces 2 earlier answers" in reply["content"]["body"]
    assert "filled a gap of" in bridge.log_text()


# The bridge killed once the gap's first page is judged and durable, before
# it judges the next.
KILL_AFTER_A_GAP_PAGE = '''
import os, signal
from bridge.service.transport import bot

_read_ahead = bot.read_ahead

async def read_ahead(pages):
    handed = 0
    async for page in _read_ahead(pages):
        if handed:
            os.kill(os.getpid(), signal.SIGKILL)
        handed += 1
        yield page

bot.read_ahead = read_ahead
'''


async def test_a_gap_read_killed_half_way_goes_on_from_there_and_each_answer_is_told_once(bridge, tmp_path):
    """The start after a kill mid-gap reads on from the last page made
    durable (it read the whole gap again from the sync token, at every
    start), and every answer of the gap counts and is acknowledged once."""
    from bridge.service.transport.bot import GAP_PAGE, SYNC_FILTER

    bridge.add_set(text_set("pages", 2))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 2)
    assert bridge.stop() == 0
    alice, room = bridge.alice, bridge.room_id
    # (The stopped bridge's last long poll may be answered from Synapse's
    # cache with the first new event: a message goes first.)
    await alice.send(room, {"msgtype": "m.text", "body": "back soon"})
    first = await alice.send(room, answer_content(questions[("q0", 1)], text="on the first page"))
    await chatter(alice, room, GAP_PAGE, "chatter")
    second = await alice.send(room, answer_content(questions[("q1", 1)], text="on the second page"))
    await chatter(alice, room, SYNC_FILTER["room"]["timeline"]["limit"], "after")
    bridge.env = hooked(tmp_path / "hook", KILL_AFTER_A_GAP_PAGE)
    bridge.start()
    await asyncio.to_thread(bridge.process.wait, 60)
    assert bridge.process.returncode == -signal.SIGKILL, bridge.log_text()[-3000:]
    assert (await bridge.wait_answer("pages", "q0", timeout=5))["text"] == "on the first page"
    bridge.env = {}
    bridge.start()
    assert (await bridge.wait_answer("pages", "q1", timeout=60))["text"] == "on the second page"
    assert (await bridge.wait_answer("pages", "q0", timeout=5))["source"]["event_id"] == first
    this_start = bridge.log_text().rsplit("--- start", 1)[1]
    filled = [int(count) for count in re.findall(r"filled a gap of (\d+) events", this_start)]
    assert filled and filled[0] < GAP_PAGE, this_start[-3000:]  # the second page only, not the whole gap again
    for answer in (first, second):
        await the_only_reply(alice, room, [answer])
