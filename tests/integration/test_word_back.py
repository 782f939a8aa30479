"""Every gesture gets a word back, in the person's own terms: against a real
Synapse, the person's client sends what Element sends and reads what the
bridge says back (one test per problem found trying it as a new user)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from helpers.harness import Person
from helpers.sets import SUBJECT
from test_element import element_edit, element_reply, polls, record, started, vote

pytestmark = pytest.mark.integration

OUTCOME = "dev.superpipeline.question.outcome"
WITHDRAWN = "dev.superpipeline.question.withdrawn"


async def bridge_says(person: Person, room: str, check, timeout: float = 20) -> dict[str, Any]:
    """The first of the bridge's messages that ``check`` accepts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in await person.messages(room):
            if check(event):
                return event
        await asyncio.sleep(0.2)
    raise AssertionError("the bridge said nothing of the kind")


def replying_to(event: dict[str, Any]) -> str | None:
    relates = event.get("content", {}).get("m.relates_to", {})
    return (relates.get("m.in_reply_to") or {}).get("event_id")


async def test_1_replies_to_the_bridges_messages_and_to_ones_own_answer_count(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    # "Not recorded … Reply with the number of your pick": the person does, to that message.
    wrong = await alice.send(room, element_reply(questions[("risk", 1)], "the risky one", bot))
    refusal = await alice.wait_notice(room, wrong)
    assert refusal["content"][OUTCOME]["outcome"] == "refused"
    fixed = await alice.send(room, element_reply(refusal, "1", bot))
    ack = await alice.wait_notice(room, fixed)
    assert ack["content"][OUTCOME]["outcome"] == "recorded" and ack["content"][OUTCOME]["qid"] == "risk"
    assert (await bridge.wait_answer("kinds", "risk"))["choice"] == "low"

    # Replying a new pick to the "Recorded" message changes the answer.
    first = await alice.send(room, element_reply(questions[("platforms", 1)], "1", bot))
    recorded = await alice.wait_notice(room, first)
    second = await alice.send(room, element_reply(recorded, "1, 2, 3", bot))
    await alice.wait_notice(room, second)
    assert (await bridge.wait_answer("kinds", "platforms", rev=2))["choices"] == ["linux", "mac", "win"]

    # And so does replying to one's own earlier answer.
    third = await alice.send(room, element_reply({"event_id": second}, "2", bot))
    await alice.wait_notice(room, third)
    assert (await bridge.wait_answer("kinds", "platforms", rev=3))["choices"] == ["mac"]

    # A reply to the bridge about no question it knows gets a short help, not silence.
    operator = Person(bridge.synapse, {"user_id": bot, "access_token": bridge.bot["access_token"]})
    try:
        chatter = await operator.send(room, {"msgtype": "m.text", "body": "Good morning, all."})
    finally:
        await operator.close()
    lost = await alice.send(room, element_reply({"event_id": chatter}, "1", bot))
    help_ = await alice.wait_notice(room, lost)
    assert help_["content"][OUTCOME]["reason"] == "unplaced_reply"
    assert "which question" in help_["content"]["body"]


async def test_2_a_withdrawal_is_told_with_what_stands_now(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    risk = questions[("risk", 1)]
    poll = (await polls(alice, room))[risk["event_id"]]
    voted = await alice.send(room, vote(poll["event_id"], ["low"]), "org.matrix.msc3381.poll.response")
    told = await alice.wait_notice(room, voted)
    # In the question's thread, where everyone's votes are told: it says whose this one is, pinging nobody.
    assert told["content"]["body"].startswith(f"{alice.user_id}: Recorded for “Risk”: ")
    assert told["content"]["m.relates_to"]["rel_type"] == "m.thread" and told["content"]["m.mentions"] == {}
    answer = await alice.send(room, element_reply(risk, "3", bot))
    ack = await alice.wait_notice(room, answer)
    await bridge.wait_answer("kinds", "risk", rev=2)

    await alice.redact(room, answer)
    told = await bridge_says(alice, room, lambda e: e["content"].get(WITHDRAWN, {}).get("withdrawn_event_id") == answer)
    assert told["content"]["body"] == "Your answer to “Risk” is withdrawn; your earlier vote, Hardly risky, stands again."
    assert replying_to(told) == ack["event_id"]  # where the acknowledgement went
    assert told["content"][WITHDRAWN]["record_rev"] == bridge.answers("kinds")["answers"]["risk"]["rev"]
    assert record(bridge, "risk")["choice"] == "low"

    # A keycap removed: nothing stands.
    ship = questions[("ship", 1)]
    reaction = await alice.send(room, {"m.relates_to": {"rel_type": "m.annotation", "event_id": ship["event_id"],
                                                        "key": "1\ufe0f\u20e3"}}, "m.reaction")
    await bridge.wait_answer("kinds", "ship")
    await alice.redact(room, reaction)
    gone = await bridge_says(alice, room, lambda e: e["content"].get(WITHDRAWN, {}).get("withdrawn_event_id") == reaction)
    assert gone["content"]["body"] == "Your reaction to “Ship it” is withdrawn; no answer is recorded now."
    assert gone["content"]["m.relates_to"]["event_id"] == ship["event_id"]  # in the question's thread, as its ack
    assert record(bridge, "ship") is None


async def test_3_an_edit_is_acknowledged_on_the_message_the_person_sees(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    first = await alice.send(room, element_reply(questions[("branch", 1)], "1", bot))
    await alice.wait_notice(room, first)
    edit = await alice.send(room, element_edit(first, "2"))
    ack = await alice.wait_notice(room, edit)
    assert replying_to(ack) == first
    assert ack["content"]["body"] == "Changed your answer to “Release branch”: now The stable branch (option 2)."
    written = bridge.answers("kinds")["answers"]["branch"]
    assert written["choice"] == "stable"
    assert ack["content"][OUTCOME]["record_rev"] == written["rev"]


async def test_4_refusals_speak_in_numbers_and_labels(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    partial = await alice.send(room, element_reply(questions[("order", 1)], "2", bot))
    refusal = (await alice.wait_notice(room, partial))["content"]["body"]
    assert refusal == ("Not recorded: Put every option in your order. Missing: 1 (“The crash on start”), "
                       "3 (“The typo in help”).")
    past = await alice.send(room, element_reply(questions[("platforms", 1)], "1, 9", bot))
    body = (await alice.wait_notice(room, past))["content"]["body"]
    assert body.startswith("Not recorded: There is no option 9 in “Platforms”; the options are 1–3.")
    assert " id" not in body


async def test_5_a_compare_pick_is_named_by_the_side_the_person_saw(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    pick = await alice.send(room, element_reply(questions[("takes", 1)], "Right", bot))
    ack = await alice.wait_notice(room, pick)
    assert ack["content"]["body"] == "Recorded for “Intro take”: Right (option 2)."
    assert record(bridge, "takes")["choice"] == "t5"


async def test_6_a_second_answer_says_it_replaces_the_earlier_one(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    await alice.wait_notice(room, await alice.send(room, element_reply(questions[("risk", 1)], "1", bot)))
    again = await alice.send(room, element_reply(questions[("risk", 1)], "2", bot))
    body = (await alice.wait_notice(room, again))["content"]["body"]
    assert body == "Recorded for “Risk”: Somewhat risky (option 2). This replaces your earlier answer."


async def test_6b_replaces_only_an_answer_that_stood_and_says_whose(bridge, person):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    risk = questions[("risk", 1)]
    first = await alice.send(room, element_reply(risk, "1", bot))
    await alice.wait_notice(room, first)
    await alice.redact(room, first)  # withdrawn: nothing stands any more
    await bridge_says(alice, room, lambda e: WITHDRAWN in e.get("content", {}))
    again = await alice.send(room, element_reply(risk, "2", bot))
    assert (await alice.wait_notice(room, again))["content"]["body"] == "Recorded for “Risk”: Somewhat risky (option 2)."
    # Someone else's answer stood: the reply says so, not "your".
    bob = person()
    bridge.synapse.invite(bridge.bot["access_token"], room, bob.user_id)
    bridge.synapse.join(bob.token, room)
    his = await bob.send(room, element_reply(risk, "1", bot))
    assert (await bob.wait_notice(room, his))["content"]["body"] == \
        "Recorded for “Risk”: Hardly risky (option 1). This replaces the answer someone else gave."


async def test_7_closed_looks_closed_approvals_repeat_the_subject_and_no_doubled_stops(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    approve = await alice.send(room, element_reply(questions[("approve", 1)], "1", bot))
    body = (await alice.wait_notice(room, approve))["content"]["body"]
    assert body == (f"Recorded for “Approve the deploy”: Approve the deploy (option 1), for {SUBJECT['id']} "
                    f"(digest {SUBJECT['digest'][:16]}…).")
    words = await alice.send(room, element_reply(questions[("name", 1)], "Borealis.", bot))
    assert (await alice.wait_notice(room, words))["content"]["body"] == "Recorded for “Release name”: “Borealis.”"

    path = bridge.sets_root / "kinds" / "questions.json"
    data = json.loads(path.read_text())
    data["questions"][0]["status"] = "closed"
    path.write_text(json.dumps(data))
    branch = questions[("branch", 1)]
    edit = await bridge_says(alice, room, lambda e: e["sender"] == bot and e["content"].get("m.relates_to", {})
                             .get("rel_type") == "m.replace"
                             and e["content"]["m.relates_to"]["event_id"] == branch["event_id"])
    shown = edit["content"]["m.new_content"]
    assert shown["body"].endswith("Closed: no longer accepting answers.") and "To answer" not in shown["body"]
    assert "Closed: no longer accepting answers" in shown["formatted_body"]
    assert "To answer" not in shown["formatted_body"]
    assert shown["body"].startswith("Question: Release branch\n")  # the question itself still reads as asked


async def test_an_answer_in_the_questions_thread_is_answered_in_that_thread(bridge):
    """Element's thread composer sends an answer as a thread message; a plain
    reply to it would show nowhere in Element, so the word back joins the thread."""
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    branch = questions[("branch", 1)]
    in_thread = await alice.send(room, {"msgtype": "m.text", "body": "2", "m.relates_to": {
        "rel_type": "m.thread", "event_id": branch["event_id"], "is_falling_back": True,
        "m.in_reply_to": {"event_id": branch["event_id"]}}})
    ack = await alice.wait_notice(room, in_thread)
    assert ack["content"][OUTCOME]["outcome"] == "recorded"
    relates = ack["content"]["m.relates_to"]
    assert (relates["rel_type"], relates["event_id"]) == ("m.thread", branch["event_id"])
    assert relates["m.in_reply_to"]["event_id"] == in_thread and relates["is_falling_back"] is False
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "stable"
