"""Bot mode against a real Synapse: people answer, read shows it."""

from __future__ import annotations

import json

import pytest

from helpers.harness import answer_content, read_set
from helpers.sets import ALL_KINDS_PICKS, SUBJECT, all_kinds_set, check_all_kinds_read
from helpers.waiting import until

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8


async def started(bridge, sets=("kinds",)):
    for name in sets:
        bridge.add_set(all_kinds_set(name))
    bridge.start()
    return await bridge.wait_questions(bridge.alice, QUESTION_COUNT * len(sets))


async def test_every_kind_and_an_approval_land_in_answers_json(bridge):
    questions = await started(bridge)
    assert len(questions) == QUESTION_COUNT
    for qid, fields in ALL_KINDS_PICKS.items():
        await bridge.alice.send(bridge.room_id, answer_content(questions[(qid, 1)], **fields))
    for qid in ALL_KINDS_PICKS:
        await bridge.wait_answer("kinds", qid)
    check_all_kinds_read(read_set(bridge.sets_root / "kinds"))


async def test_refused_answers_get_a_reason_and_never_reach_the_folder(bridge, person, synapse):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    approve = questions[("approve", 1)]
    cases = {
        "option_not_offered": answer_content(questions[("branch", 1)], option_id="nightly"),
        "input_required": answer_content(questions[("risk", 1)], option_id="other"),
        "wrong_digest": answer_content(approve, option_id="approve",
                                           subject={"id": SUBJECT["id"], "digest": "0" * 64}),
        "wrong_reference": {**answer_content(questions[("branch", 1)], option_id="main"),
                            "m.relates_to": {"rel_type": "m.reference", "event_id": approve["event_id"]}},
    }
    no_binding = answer_content(approve, option_id="approve")
    del no_binding["subject"]
    cases["subject_missing"] = no_binding
    sent = {reason: await alice.send(room, content) for reason, content in cases.items()}
    for reason, event_id in sent.items():
        notice = await alice.wait_notice(room, event_id)
        outcome = notice["content"]["dev.superpipeline.question.outcome"]
        assert outcome["outcome"] == "refused"
        assert outcome["layer"] == "recorded"
        assert outcome["reason"] == reason, (reason, notice["content"]["body"])
        assert notice["content"]["body"].startswith("Not recorded: ")
        assert notice["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == event_id
    assert bridge.answers("kinds")["answers"] == {}


async def test_a_sender_not_among_answerers_is_refused(bridge, person, synapse):
    bob = person()
    bridge.extra_config = {"answerers": [bridge.alice.user_id]}
    questions = await started(bridge)
    # The room is private: bob gets in by invitation from the bot.
    synapse.invite(bridge.bot["access_token"], bridge.room_id, bob.user_id)
    synapse.join(bob.token, bridge.room_id)
    event_id = await bob.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    notice = await bob.wait_notice(bridge.room_id, event_id)
    assert notice["content"]["dev.superpipeline.question.outcome"]["reason"] == "sender_not_allowed"
    accepted = await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")
    assert bridge.answers("kinds")["answers"]["branch"]["source"]["event_id"] == accepted


async def test_a_broken_set_is_reported_and_the_good_one_posted(bridge):
    bad = bridge.sets_root / "broken"
    bad.mkdir()
    (bad / "questions.json").write_text('{"askwright": 1, "id": "broken", "questions": [')
    questions = await started(bridge)
    assert len(questions) == QUESTION_COUNT
    assert all(event["content"]["set"]["id"] == "kinds" for event in questions.values())
    log = bridge.log_text()
    assert "broken" in log and "skipped" in log


async def test_a_new_revision_is_posted_and_an_answer_to_the_old_one_is_stale(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")
    path = bridge.sets_root / "kinds" / "questions.json"
    data = json.loads(path.read_text())
    data["questions"][0]["rev"] = 2
    data["questions"][0]["question"] = "Which branch should the 2.0 release be cut from?"
    data["questions"][0]["title"] = "Release branch (2.0)"
    path.write_text(json.dumps(data))
    found = await bridge.wait_questions(alice, QUESTION_COUNT + 1)
    assert ("branch", 2) in found
    # The old message's thread says where to answer now, by the title the new one shows.
    old_id = questions[("branch", 1)]["event_id"]

    async def closing() -> str | None:
        return next((e["content"]["body"] for e in await alice.messages(room)
                     if e.get("content", {}).get("dev.superpipeline.question.closed", {}).get("question_event_id")
                     == old_id), None)
    told = await until(closing, 20, "the old posting's close told")
    assert told.endswith("is replaced by revision 2; answers to this message are no longer accepted. "
                         "Answer revision 2, “Release branch (2.0)”, instead."), told
    view = read_set(bridge.sets_root / "kinds")
    branch = next(a for a in view["answers"] if a["qid"] == "branch")
    assert (branch["q_rev"], branch["current_rev"], branch["stale"]) == (1, 2, True)
    # rev 1 is replaced: answering it now is refused, answering rev 2 lands.
    late = await alice.send(room, answer_content(questions[("branch", 1)], option_id="stable"))
    notice = await alice.wait_notice(room, late)
    assert notice["content"]["dev.superpipeline.question.outcome"]["reason"] == "question_closed"
    await alice.send(room, answer_content(found[("branch", 2)], option_id="stable"))
    record = await bridge.wait_answer("kinds", "branch", rev=2)
    assert (record["choice"], record["q_rev"]) == ("stable", 2)


async def test_sigterm_exits_cleanly(bridge):
    await started(bridge)
    assert bridge.stop() == 0


async def test_an_answers_json_its_agent_deleted_is_written_again_whole(bridge):
    """The agent deleted answers.json: the next answer wrote a file holding
    that answer alone, every earlier one gone from the folder (read, wait,
    status); deleted while the bridge was down, nothing wrote it again."""
    questions = await started(bridge)
    alice, room, answers = bridge.alice, bridge.room_id, bridge.sets_root / "kinds" / "answers.json"
    await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")
    answers.unlink()
    await alice.send(room, answer_content(questions[("name", 1)], text="Borealis"))
    await bridge.wait_answer("kinds", "name")
    assert sorted(bridge.answers("kinds")["answers"]) == ["branch", "name"]
    assert bridge.stop() == 0
    answers.unlink()
    bridge.start()
    await until(lambda: answers.exists(), what="answers.json written again at the start", timeout=30)
    assert sorted(bridge.answers("kinds")["answers"]) == ["branch", "name"]
    # Deleted while down, with an answer waiting for the start's first batch.
    assert bridge.stop() == 0
    answers.unlink()
    await alice.send(room, answer_content(questions[("risk", 1)], option_id="other", text="the migration"))
    bridge.start()
    await bridge.wait_answer("kinds", "risk", timeout=30)
    assert sorted(bridge.answers("kinds")["answers"]) == ["branch", "name", "risk"]
