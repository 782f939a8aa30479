"""One bad event, set, file or room never stops the rest (issue 14).

Each test breaks one thing for real against the real Synapse, with a second
set beside the first, and checks what people see: answers to the other set
keep landing and being acknowledged, the broken thing gets a clear outcome
(a refusal to the person, or a line in ``status``), and the bridge starts
again after kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from helpers.attack import text_set
from helpers.harness import Bridge, answer_content, store_rows

THREAD = "m.thread"


def status(bridge: Bridge) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(bridge.config_path), "--json"],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


async def two_sets(bridge: Bridge) -> dict[tuple[str, int], dict[str, Any]]:
    """Sets ``alpha`` (q0, q1) and ``beta`` (q0, q1), posted; questions keyed (set, qid)."""
    bridge.add_set(text_set("alpha", 2))
    bridge.add_set(text_set("beta", 2))
    bridge.start()
    deadline = time.monotonic() + 30
    while True:
        found = {}
        for event in await bridge.alice.messages(bridge.room_id):
            content = event.get("content", {})
            if content.get("suite_event_type") == "dev.superpipeline.question.v2":
                found[(content["set"]["id"], content["question"]["id"])] = event
        if len(found) == 4:
            return found
        bridge.check_alive()
        assert time.monotonic() < deadline, f"{len(found)} of 4 questions posted"
        await asyncio.sleep(0.2)


async def lands(bridge: Bridge, question: dict[str, Any], text: str, timeout: float = 30) -> str:
    """Answer ``question`` and wait until the record is in answers.json and acknowledged."""
    set_id, qid = question["content"]["set"]["id"], question["content"]["question"]["id"]
    sent = await bridge.alice.send(bridge.room_id, answer_content(question, text=text))
    deadline = time.monotonic() + timeout
    while bridge.answers(set_id)["answers"].get(qid, {}).get("text") != text:
        bridge.check_alive()
        assert time.monotonic() < deadline, f"{text!r} not in {set_id}/answers.json\n{bridge.log_text()[-3000:]}"
        await asyncio.sleep(0.1)
    notice = await bridge.alice.wait_notice(bridge.room_id, sent, timeout=timeout)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    return sent


async def restarts_after_kill(bridge: Bridge, question: dict[str, Any], text: str) -> None:
    bridge.kill()
    bridge.start()
    await lands(bridge, question, text)


def in_thread(question: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    root = question["event_id"]
    return {**content, "m.relates_to": {"rel_type": THREAD, "event_id": root, "is_falling_back": True,
                                        "m.in_reply_to": {"event_id": root}}}


async def test_a_timecode_of_a_few_hundred_digits_stops_nothing(bridge):
    questions = await two_sets(bridge)
    alpha, beta = questions[("alpha", "q0")], questions[("beta", "q0")]
    await lands(bridge, alpha, "first")
    boom = await bridge.alice.send(bridge.room_id, in_thread(alpha, {"msgtype": "m.text",
                                                                     "body": "9" * 400 + " s: boom"}))
    notice = await bridge.alice.wait_notice(bridge.room_id, boom)
    record = bridge.answers("alpha")["answers"]["q0"]
    # Not a time in any clip: the line is kept as the person wrote it, as a note.
    assert record["note"].endswith("s: boom") and "timecodes" not in record
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    await lands(bridge, beta, "after the boom")
    await restarts_after_kill(bridge, alpha, "after a restart")


async def test_a_removed_set_folder_holds_back_only_that_set(bridge):
    questions = await two_sets(bridge)
    alpha, beta = questions[("alpha", "q0")], questions[("beta", "q0")]
    await lands(bridge, alpha, "before")
    archive = bridge.workdir / "archived-alpha"
    os.rename(bridge.sets_root / "alpha", archive)
    late = await bridge.alice.send(bridge.room_id, answer_content(questions[("alpha", "q1")], text="to a gone set"))
    await lands(bridge, beta, "beta goes on")
    deadline = time.monotonic() + 20
    while True:  # the late answer is not acknowledged as recorded, and status says why
        outcomes = [n["content"]["dev.superpipeline.question.outcome"]["outcome"]
                    for n in await bridge.alice.notices_for(bridge.room_id, late)]
        assert "recorded" not in outcomes
        held = status(bridge)["held_back"]
        if outcomes or held["sets"]:
            break
        assert time.monotonic() < deadline, "neither refused nor held back"
        await asyncio.sleep(0.5)
    await restarts_after_kill(bridge, beta, "beta after a restart")


async def test_a_corrupt_answers_json_holds_back_that_set_until_it_is_mended(bridge):
    questions = await two_sets(bridge)
    alpha, beta = questions[("alpha", "q0")], questions[("beta", "q0")]
    await lands(bridge, alpha, "before")
    answers = bridge.sets_root / "alpha" / "answers.json"
    answers.write_text('{"askwright": 1, "set": "alpha", "rev": 3, "answers": {')  # another writer died mid-file
    held_answer = await bridge.alice.send(bridge.room_id, answer_content(alpha, text="while corrupt"))
    await lands(bridge, beta, "beta goes on")
    await asyncio.sleep(1)
    assert await bridge.alice.notices_for(bridge.room_id, held_answer) == [], "acknowledged before it was written"
    [held] = status(bridge)["held_back"]["sets"]
    assert held["set_id"] == "alpha" and "answers.json can't be read" in held["reason"]
    bridge.kill()
    bridge.start()  # stored state that can't be written never stops the start
    await lands(bridge, beta, "beta after a restart")
    answers.unlink()  # the operator mends it
    notice = await bridge.alice.wait_notice(bridge.room_id, held_answer, timeout=40)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert bridge.answers("alpha")["answers"]["q0"]["text"] == "while corrupt"
    assert status(bridge)["held_back"]["sets"] == []


async def test_a_symlinked_attachments_folder_refuses_that_file_only(bridge):
    questions = await two_sets(bridge)
    alpha, beta = questions[("alpha", "q0")], questions[("beta", "q0")]
    await lands(bridge, alpha, "before")
    outside = bridge.workdir / "outside"
    outside.mkdir()
    (bridge.sets_root / "alpha" / "attachments").symlink_to(outside, target_is_directory=True)
    upload = await bridge.alice.client.upload(lambda *_: b"\x89PNG fake", content_type="image/png",
                                              filename="a.png", filesize=9)
    url = upload[0].content_uri
    picture = await bridge.alice.send(bridge.room_id, in_thread(alpha, {"msgtype": "m.image", "body": "a.png",
                                                                        "url": url}))
    notice = await bridge.alice.wait_notice(bridge.room_id, picture)
    outcome = notice["content"]["dev.superpipeline.question.outcome"]
    assert (outcome["outcome"], outcome["reason"]) == ("refused", "attachment_not_saved")
    assert list(outside.iterdir()) == []
    await lands(bridge, beta, "beta goes on")
    await lands(bridge, alpha, "alpha too")
    await restarts_after_kill(bridge, alpha, "after a restart")


async def test_a_file_the_homeserver_cannot_serve_is_refused_and_the_rest_goes_on(bridge):
    questions = await two_sets(bridge)
    alpha, beta = questions[("alpha", "q0")], questions[("beta", "q0")]
    await lands(bridge, alpha, "before")
    # A server that went away: the homeserver can't fetch from it.
    picture = await bridge.alice.send(bridge.room_id, in_thread(alpha, {
        "msgtype": "m.image", "body": "gone.png", "url": "mxc://127.0.0.1:9/nothing-here"}))
    captioned = await bridge.alice.send(bridge.room_id, in_thread(alpha, {
        "msgtype": "m.image", "body": "look at the corner", "filename": "gone2.png",
        "url": "mxc://127.0.0.1:9/nothing-either"}))
    await lands(bridge, beta, "beta goes on", timeout=90)
    notice = await bridge.alice.wait_notice(bridge.room_id, picture, timeout=90)
    outcome = notice["content"]["dev.superpipeline.question.outcome"]
    assert outcome["outcome"] == "refused" and outcome["reason"].startswith("attachment_")
    # The note that came with a file still lands; the reply says the file was not kept.
    notice = await bridge.alice.wait_notice(bridge.room_id, captioned, timeout=90)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert "could not be" in notice["content"]["body"]
    assert bridge.answers("alpha")["answers"]["q0"]["note"] == "look at the corner"
    assert store_rows(bridge.store_path, "SELECT problem FROM attachment WHERE event_id=?", picture)[0][0]
    await restarts_after_kill(bridge, beta, "after a restart")


def two_rooms(synapse, tmp_path, person) -> tuple[Any, Any, dict[str, Any], str, str, Bridge]:
    """Room A the bot made; room B someone else owns, where set beta goes;
    Alice in both. (owner, alice, bot, room A, room B, a bridge not started.)"""
    owner, alice = person(), person()
    bot = synapse.register(f"askbot{os.getpid()}{int(time.time() * 1000) % 100000}")
    room_a = synapse.create_room(bot["access_token"], invite=[alice.user_id])
    synapse.join(alice.token, room_a)
    room_b = synapse.create_room(owner.token, invite=[alice.user_id, bot["user_id"]])
    synapse.join(alice.token, room_b)
    synapse.join(bot["access_token"], room_b)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_a, bot=bot,
                    extra_config={"rooms": {"default": room_a, "sets": {"beta": room_b}}})
    bridge.sets_root.mkdir()
    bridge.alice = alice
    return owner, alice, bot, room_a, room_b, bridge


async def both_posted(bridge: Bridge, alice: Any, room_b: str) -> tuple[dict[str, Any], dict[Any, Any]]:
    """Sets alpha (room A) and beta (room B) added and the bridge started:
    alpha's question, and what room B shows of beta's."""
    bridge.add_set(text_set("alpha", 1))
    bridge.add_set(text_set("beta", 1))
    bridge.start()
    alpha = (await bridge.wait_questions(alice, 1))[("q0", 1)]
    deadline = time.monotonic() + 30
    while not (beta := await alice.questions(room_b)):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    return alpha, beta


async def test_a_room_the_bridge_may_no_longer_post_in_drops_its_notice_only(synapse, tmp_path, person):
    """The bridge may not post in room B any more (its power taken away) while
    an answer there waits for its notice: the notice is dropped and counted,
    and room A's notices keep coming."""
    owner, alice, bot, room_a, room_b, bridge = two_rooms(synapse, tmp_path, person)
    try:
        alpha, found = await both_posted(bridge, alice, room_b)
        beta = found[("q0", 1)]
        # Room B's owner: every message needs power 50 now; the bridge has 0, Alice 50.
        levels = await owner.client.room_get_state_event(room_b, "m.room.power_levels")
        content = dict(levels.content)
        content["events_default"] = 50
        content["users"] = {**content.get("users", {}), alice.user_id: 50}
        changed = await owner.client.room_put_state(room_b, "m.room.power_levels", content)
        assert hasattr(changed, "event_id"), changed
        answer_b = await alice.send(room_b, answer_content(beta, text="in room b"))
        deadline = time.monotonic() + 30
        while bridge.answers("beta")["answers"].get("q0", {}).get("text") != "in room b":
            bridge.check_alive()
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await lands(bridge, alpha, "room a goes on")
        deadline = time.monotonic() + 30
        while not (dropped := status(bridge)["held_back"]["notices"]):
            assert time.monotonic() < deadline, "the notice for room B was neither sent nor dropped"
            await asyncio.sleep(0.5)
        assert dropped[0]["room_id"] == room_b and dropped[0]["reason"] == "M_FORBIDDEN"
        assert await alice.notices_for(room_b, answer_b) == []
        await lands(bridge, alpha, "and again")
        await restarts_after_kill(bridge, alpha, "after a restart")
        # Kicked from room B for good (it is invite-only): a start does not wait on it.
        kicked = await owner.client.room_kick(room_b, bot["user_id"], reason="no more questions here")
        assert not hasattr(kicked, "status_code"), kicked
        await restarts_after_kill(bridge, alpha, "after the kick")
        assert "cannot join" in bridge.log_text()
    finally:
        bridge.kill()


async def test_a_set_edited_while_its_room_refuses_the_bridge_is_posted_once_the_room_takes_it_back(
        synapse, tmp_path, person):
    # Only a set that failed in the start's scan was tried again: one an
    # agent edited while its room refused the bridge stayed unposted for good.
    owner, alice, bot, room_a, room_b, bridge = two_rooms(synapse, tmp_path, person)
    try:
        bridge.add_set(text_set("alpha", 1))
        beta = bridge.add_set(text_set("beta", 1))
        bridge.start()
        await bridge.wait_questions(alice, 1)
        deadline = time.monotonic() + 30
        while not await alice.questions(room_b):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)  # the start's scans are over: only the folder watch sees the edit
        levels = await owner.client.room_get_state_event(room_b, "m.room.power_levels")
        before = dict(levels.content)
        await owner.client.room_put_state(room_b, "m.room.power_levels", {
            **before, "events_default": 50, "users": {**before.get("users", {}), alice.user_id: 50}})
        (beta / "questions.json").write_text(json.dumps(text_set("beta", 2)))
        deadline = time.monotonic() + 30
        while "not posted yet" not in bridge.log_text():
            assert time.monotonic() < deadline, "the edit was never tried"
            await asyncio.sleep(0.2)
        await owner.client.room_put_state(room_b, "m.room.power_levels", before)
        deadline = time.monotonic() + 45
        while ("q1", 1) not in await alice.questions(room_b):
            bridge.check_alive()
            assert time.monotonic() < deadline, "the edited set was never posted once the room took the bridge back"
            await asyncio.sleep(0.5)
    finally:
        bridge.kill()


async def test_a_bridge_kicked_from_a_room_says_so_in_health_until_it_is_invited_back(synapse, tmp_path, person):
    # Kicked from its room, the bridge logged nothing and /health stayed
    # ready with nothing held: its open questions there waited in silence.
    import urllib.error
    import urllib.request

    from helpers.agents import free_port

    owner, alice, bot, room_a, room_b, bridge = two_rooms(synapse, tmp_path, person)
    port = free_port()
    bridge.extra_config["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}

    def health() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    try:
        alpha, beta = await both_posted(bridge, alice, room_b)
        kicked = await owner.client.room_kick(room_b, bot["user_id"], reason="no more questions here")
        assert not hasattr(kicked, "status_code"), kicked
        deadline = time.monotonic() + 30
        while room_b not in (removed := health().get("removed_from_rooms", {})):
            assert time.monotonic() < deadline, (room_b, json.dumps(health()))
            await asyncio.sleep(0.2)
        assert removed[room_b] == {"by": owner.user_id, "membership": "leave", "reason": "no more questions here"}
        assert f"the bridge was removed from room {room_b} by {owner.user_id}" in bridge.log_text()
        await lands(bridge, alpha, "room a goes on")
        # Said while it was out, then more than a sync's timeline of chatter:
        # read from where it was removed once it is back (its sync token had
        # moved past all of it: the answer was lost).
        await alice.send(room_b, answer_content(beta[("q0", 1)], text="said while the bridge was out"))
        for start in range(0, 250, 25):
            await asyncio.gather(*(owner.send(room_b, {"msgtype": "m.text", "body": f"chatter {n}"})
                                   for n in range(start, start + 25)))
        # Invited back: it joins again by itself, and /health forgets the removal.
        invited = await owner.client.room_invite(room_b, bot["user_id"])
        assert not hasattr(invited, "status_code"), invited
        deadline = time.monotonic() + 30
        while room_b in health().get("removed_from_rooms", {}):
            assert time.monotonic() < deadline, health()
            await asyncio.sleep(0.2)
        assert (await bridge.wait_answer("beta", "q0", timeout=60))["text"] == "said while the bridge was out"
    finally:
        bridge.kill()


@pytest.mark.parametrize("chatter", ["none", "more than a timeline"])
async def test_an_answer_given_before_the_bridge_was_kicked_while_stopped_lands(synapse, tmp_path, person, chatter):
    # The bridge stopped, an answer, then kicked: the start's sync brings the
    # room among those left.  Its members were never read this run (a
    # non-member can't), and the answer was refused as from no member, for
    # good; behind more than a sync's timeline of chatter, it sat in a gap
    # never read.  It was said while the bridge was a member: it counts.
    from bridge.service.transport.bot import SYNC_FILTER

    owner, alice, bot, room_a, room_b, bridge = two_rooms(synapse, tmp_path, person)
    try:
        alpha, beta = await both_posted(bridge, alice, room_b)
        assert bridge.stop() == 0
        # (The stopped bridge's last long poll may come back to the next start
        # with the first new event: chatter goes first, so the answer is in the gap.)
        await owner.send(room_b, {"msgtype": "m.text", "body": "while it is away"})
        answer = await alice.send(room_b, answer_content(beta[("q0", 1)], text="said before the kick"))
        count = SYNC_FILTER["room"]["timeline"]["limit"] + 50 if chatter != "none" else 0
        for start in range(0, count, 25):
            await asyncio.gather(*(owner.send(room_b, {"msgtype": "m.text", "body": f"chatter {n}"})
                                   for n in range(start, start + 25)))
        kicked = await owner.client.room_kick(room_b, bot["user_id"], reason="tidying up")
        assert not hasattr(kicked, "status_code"), kicked
        bridge.start()
        await lands(bridge, alpha, "room a goes on")
        record = await bridge.wait_answer("beta", "q0", timeout=30)
        assert record["text"] == "said before the kick" and record["source"]["event_id"] == answer
        assert "sender_not_allowed" not in bridge.log_text()
    finally:
        bridge.kill()
