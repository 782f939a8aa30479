"""Nothing lost, nothing twice: the bridge killed, the homeserver restarted."""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3

import pytest

from bridge.protocol.poll import POLL_START
from helpers.harness import answer_content, hooked, question_posts, store_rows
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

QUESTIONS = 8


def accepted_in_log(bridge, qid: str) -> int:
    with sqlite3.connect(bridge.store_path) as db:
        return db.execute("SELECT COUNT(*) FROM answer_log WHERE qid=? AND outcome='accepted'", (qid,)).fetchone()[0]


async def test_kill_9_while_a_person_answers_loses_nothing_and_repeats_nothing(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTIONS)
    branch = questions[("branch", 1)]
    rng = random.Random(7)
    total = 40
    kills_at = sorted(rng.sample(range(5, total - 5), 2))
    sent = []
    for n in range(total):
        pick = "main" if n % 2 else "stable"
        sent.append(await bridge.alice.send(bridge.room_id, answer_content(branch, option_id=pick)))
        if n in kills_at:
            await asyncio.sleep(rng.uniform(0, 0.3))
            bridge.kill()
            bridge.start()
        await asyncio.sleep(0.02)
    record = await bridge.wait_answer("kinds", "branch", rev=total, timeout=60)
    assert record["rev"] == total
    assert record["source"]["event_id"] == sent[-1]
    assert record["choice"] == ("main" if (total - 1) % 2 else "stable")
    assert accepted_in_log(bridge, "branch") == total
    # Every question posted exactly once, across three starts.
    posted = await bridge.alice.questions(bridge.room_id)
    events = [e for e in await bridge.alice.messages(bridge.room_id)
              if e["content"].get("suite_event_type") == "dev.superpipeline.question.v2"]
    assert len(posted) == len(events) == QUESTIONS
    assert bridge.starts == 3


async def test_answers_sent_while_the_bridge_is_down_land_on_start(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTIONS)
    assert bridge.stop() == 0
    for pick in ("stable", "main", "stable"):
        await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id=pick))
    # More than a sync's default ten events while down: the gap must be filled.
    for n in range(12):
        await bridge.alice.send(bridge.room_id, {"msgtype": "m.text", "body": f"chatter {n}"})
    await bridge.alice.send(bridge.room_id, answer_content(questions[("name", 1)], text="Late name"))
    bridge.start()
    record = await bridge.wait_answer("kinds", "branch", rev=3)
    assert record["choice"] == "stable"
    assert (await bridge.wait_answer("kinds", "name"))["text"] == "Late name"


async def test_synapse_stopped_and_restarted_mid_run(bridge, synapse):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTIONS)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")
    synapse.stop()
    await asyncio.sleep(3)
    bridge.check_alive()
    synapse.start()
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="stable"))
    record = await bridge.wait_answer("kinds", "branch", rev=2, timeout=40)
    assert record["choice"] == "stable"
    bridge.check_alive()


async def test_a_limited_sync_after_downtime_is_back_filled(bridge):
    """More events while down than one sync returns: the oldest answers must still land."""
    from bridge.service.transport.bot import SYNC_FILTER

    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTIONS)
    assert bridge.stop() == 0
    # The stopped bridge's last long-poll may still complete on the server
    # with the first new event and be handed to the next start from Synapse's
    # response cache: a message goes first so the answer is only in the gap.
    await bridge.alice.send(bridge.room_id, {"msgtype": "m.text", "body": "back soon"})
    first = await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="stable"))
    for n in range(SYNC_FILTER["room"]["timeline"]["limit"] + 20):
        await bridge.alice.send(bridge.room_id, {"msgtype": "m.text", "body": f"chatter {n}"})
    bridge.start()
    record = await bridge.wait_answer("kinds", "branch", timeout=40)
    assert record["source"]["event_id"] == first
    assert "filled a gap" in bridge.log_text()


def choice_set(set_id: str, count: int) -> dict:
    return {"askwright": 1, "id": set_id, "title": f"Set {set_id}", "questions": [{
        "id": f"q{n}", "kind": "choice", "title": f"Item {n}", "question": f"Which way for item {n}?",
        "why": "The release needs it.", "options": [{"id": "a", "label": "This way"}, {"id": "b", "label": "That way"}],
        "guess": {"option": "a", "why": "The usual way.", "confidence": "high"},
    } for n in range(count)]}


async def test_answers_land_during_a_long_first_posting_and_a_stop_cuts_it_short(bridge):
    sets, per_set = 30, 4
    total = sets * per_set
    for n in range(sets):
        bridge.add_set(choice_set(f"many{n:02d}", per_set))
    bridge.start()
    first = None
    for _ in range(300):
        bridge.check_alive()
        posted = {(e["content"]["set"]["id"], e["content"]["question"]["id"]): e
                  for e in question_posts(await bridge.alice.messages(bridge.room_id))}
        first = posted.get(("many00", "q0"))
        if first:
            break
        await asyncio.sleep(0.1)
    assert first is not None, bridge.log_text()[-3000:]
    await bridge.alice.send(bridge.room_id, answer_content(first, option_id="b"))
    record = await bridge.wait_answer("many00", "q0")
    assert record["choice"] == "b"
    # Recorded while most of the sets were still waiting to be posted.
    assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM posted")[0][0] < total
    assert bridge.stop(timeout=15) == 0  # a stop mid-posting does not wait for the last set
    cut_at = store_rows(bridge.store_path, "SELECT COUNT(*) FROM posted")[0][0]
    assert cut_at < total
    bridge.start()
    for _ in range(1200):
        bridge.check_alive()
        if store_rows(bridge.store_path, "SELECT COUNT(*) FROM posted")[0][0] == total:
            break
        await asyncio.sleep(0.1)
    posts = question_posts(await bridge.alice.messages(bridge.room_id, limit=1000))
    keys = [(e["content"]["set"]["id"], e["content"]["question"]["id"]) for e in posts]
    assert len(keys) == len(set(keys)) == total  # none posted twice across the stop


# Loaded first by the bridge's interpreter (``sitecustomize``): the process
# dies with SIGKILL where a machine could lose it, the question event (or its
# poll) sent and not yet recorded.
KILL_BEFORE_RECORDING = '''
import os, signal
from bridge.service.storage.postings import Postings

def killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

Postings.{method} = killed
'''


@pytest.mark.parametrize("method", ["record_posted", "set_poll"], ids=["the question", "its poll"])
async def test_an_answer_to_a_question_sent_just_before_a_kill_counts(bridge, tmp_path, method):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.env = hooked(tmp_path / "hook", KILL_BEFORE_RECORDING.replace("{method}", method))
    bridge.start()
    await asyncio.to_thread(bridge.process.wait, 60)
    assert bridge.process.returncode == -signal.SIGKILL, bridge.log_text()[-3000:]
    sent = await bridge.alice.questions(bridge.room_id)
    [(qid, rev)] = sent  # in the room, not in the store
    assert qid == "branch", f"the set's first question is {qid}, not the one the test answers"
    # Answered at once, before the bridge is back: the answer is in the first
    # batch of the next start, before the sets are read again.
    if method == "set_poll":
        [poll] = [e for e in await bridge.alice.messages(bridge.room_id) if e["type"] == POLL_START]
        await bridge.alice.send(bridge.room_id, {
            "m.relates_to": {"rel_type": "m.reference", "event_id": poll["event_id"]},
            "org.matrix.msc3381.poll.response": {"answers": ["stable"]}}, "org.matrix.msc3381.poll.response")
    else:
        await bridge.alice.send(bridge.room_id, answer_content(sent[(qid, rev)], option_id="stable"))
    bridge.env = {}
    bridge.start()
    assert (await bridge.wait_answer("kinds", qid))["choice"] == "stable"
    posted = await bridge.wait_questions(bridge.alice, QUESTIONS)
    assert posted[(qid, rev)]["event_id"] == sent[(qid, rev)]["event_id"]
    events = await bridge.alice.messages(bridge.room_id)
    assert sum(1 for event in events
               if event["content"].get("suite_event_type") == "dev.superpipeline.question.v2") == QUESTIONS
    polls = [e["content"][POLL_START]["question"]["body"] for e in events if e["type"] == POLL_START]
    assert len(polls) == len(set(polls)), f"a poll posted twice: {polls}"
