"""Answering from Element as it is, against a real Synapse: the person's client
sends exactly what Element sends (PROTOCOL section 3) and nothing custom."""

from __future__ import annotations

import asyncio
import io
import json
import struct
import time
import zlib
from html.parser import HTMLParser
from typing import Any

import pytest
from nio import UploadResponse

from helpers.harness import read_set
from helpers.sets import all_kinds_set
from helpers.waiting import until

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8
POLL_START = "org.matrix.msc3381.poll.start"
POLL_KEY = "dev.superpipeline.question.poll"
OUTCOME = "dev.superpipeline.question.outcome"


async def started(bridge, qset: dict[str, Any] | None = None, count: int = QUESTION_COUNT):
    bridge.add_set(qset or all_kinds_set("kinds"))
    bridge.start()
    return await bridge.wait_questions(bridge.alice, count)


async def polls(person, room: str, timeout: float = 20) -> dict[str, dict[str, Any]]:
    """Question event id -> its poll event."""
    deadline = time.monotonic() + timeout
    while True:
        found = {e["content"][POLL_KEY]["question_event_id"]: e for e in await person.messages(room)
                 if e.get("type") == POLL_START and POLL_KEY in e.get("content", {})}
        if len(found) >= 5 or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


def element_reply(question_event: dict[str, Any], body: str, bot: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": body, "m.mentions": {"user_ids": [bot]},
            "m.relates_to": {"m.in_reply_to": {"event_id": question_event["event_id"]}}}


def element_thread(question_event: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    root = question_event["event_id"]
    return {**content, "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                        "m.in_reply_to": {"event_id": root}}}


def element_edit(original: str, body: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": f" * {body}", "m.mentions": {},
            "m.new_content": {"msgtype": "m.text", "body": body, "m.mentions": {}},
            "m.relates_to": {"rel_type": "m.replace", "event_id": original}}


def vote(poll_event_id: str, answers: list[str]) -> dict[str, Any]:
    return {"m.relates_to": {"rel_type": "m.reference", "event_id": poll_event_id},
            "org.matrix.msc3381.poll.response": {"answers": answers}}


def png(width: int = 3, height: int = 2) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def record(bridge, qid: str) -> dict[str, Any] | None:
    return bridge.answers("kinds")["answers"].get(qid)


# ---------------------------------------------------------------- polls


async def test_poll_votes_in_both_formats_land_as_that_choice(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    found = await polls(alice, room)
    branch, risk = questions[("branch", 1)], questions[("risk", 1)]
    assert {branch["event_id"], risk["event_id"], questions[("takes", 1)]["event_id"]} <= set(found)
    assert questions[("platforms", 1)]["event_id"] not in found  # multi is answered by reply
    poll = found[branch["event_id"]]["content"][POLL_START]
    assert poll["kind"] == "org.matrix.msc3381.poll.disclosed" and poll["max_selections"] == 1
    # Every option a vote alone can answer; "other" needs words, left to a reply.
    assert [a["id"] for a in poll["answers"]] == [o["id"] for o in branch["content"]["question"]["options"]
                                                  if o["id"] != "other"]
    assert "vote in the poll" in branch["content"]["body"]

    await alice.send(room, vote(found[branch["event_id"]]["event_id"], ["stable"]),
                     "org.matrix.msc3381.poll.response")
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "stable"
    await alice.send(room, {"m.relates_to": {"rel_type": "m.reference", "event_id": found[risk["event_id"]]["event_id"]},
                            "m.selections": ["high"]}, "m.poll.response")
    assert (await bridge.wait_answer("kinds", "risk"))["choice"] == "high"

    # The latest vote wins; an empty vote withdraws the answer.
    await alice.send(room, vote(found[branch["event_id"]]["event_id"], ["main"]), "org.matrix.msc3381.poll.response")
    assert (await bridge.wait_answer("kinds", "branch", rev=2))["choice"] == "main"
    await alice.send(room, vote(found[branch["event_id"]]["event_id"], []), "org.matrix.msc3381.poll.response")
    await until(lambda: record(bridge, "branch") is None, what="the empty vote withdrawing the answer")


async def test_a_poll_a_moderator_ended_takes_no_more_votes_and_its_question_still_takes_replies(bridge, person):
    """A moderator ends the bridge's poll from Element (anyone with the
    power to redact it may): Element shows the votes until then as final
    and takes no more.  A vote sent after it (another client) was recorded
    all the same, and the record said what nobody in the room saw."""
    from urllib.parse import quote

    from bridge.devserver import _http_json

    questions = await started(bridge)
    alice, room, synapse = bridge.alice, bridge.room_id, bridge.synapse
    moderator = person()
    synapse.invite(bridge.bot["access_token"], room, moderator.user_id)
    synapse.join(moderator.token, room)
    levels_url = f"{synapse.url}/_matrix/client/v3/rooms/{quote(room)}/state/m.room.power_levels/"
    levels = _http_json("GET", levels_url, None, bridge.bot["access_token"])
    levels["users"][moderator.user_id] = 50  # a moderator: the power to redact others' messages
    _http_json("PUT", levels_url, levels, bridge.bot["access_token"])
    branch = questions[("branch", 1)]
    poll = (await polls(alice, room))[branch["event_id"]]
    await alice.send(room, vote(poll["event_id"], ["stable"]), "org.matrix.msc3381.poll.response")
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "stable"
    await moderator.send(room, {"m.relates_to": {"rel_type": "m.reference", "event_id": poll["event_id"]},
                                "org.matrix.msc3381.poll.end": {}, "org.matrix.msc1767.text": "Ended poll"},
                         "org.matrix.msc3381.poll.end")
    late = await alice.send(room, vote(poll["event_id"], ["main"]), "org.matrix.msc3381.poll.response")
    notice = await alice.wait_notice(room, late)
    assert notice["content"][OUTCOME]["reason"] == "poll_ended", notice["content"]["body"]
    assert f"This poll was ended by {moderator.user_id}" in notice["content"]["body"]
    assert record(bridge, "branch")["choice"] == "stable"  # what the ended poll shows
    reply = await alice.send(room, element_reply(branch, "1", bridge.bot["user_id"]))  # the question still open
    assert (await alice.wait_notice(room, reply))["content"][OUTCOME]["outcome"] == "recorded"
    assert (await bridge.wait_answer("kinds", "branch", rev=2))["choice"] == "main"


async def test_the_poll_is_ended_when_its_question_is_closed(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    poll = (await polls(alice, room))[questions[("branch", 1)]["event_id"]]
    path = bridge.sets_root / "kinds" / "questions.json"
    data = json.loads(path.read_text())
    data["questions"][0]["status"] = "closed"
    path.write_text(json.dumps(data))

    async def ended() -> list[dict[str, Any]]:
        return [e for e in await alice.messages(room) if e.get("type") == "org.matrix.msc3381.poll.end"
                and e["content"]["m.relates_to"]["event_id"] == poll["event_id"]]

    deadline = time.monotonic() + 20
    while not await ended():
        assert time.monotonic() < deadline, "the poll was not ended"
        await asyncio.sleep(0.2)
    late = await alice.send(room, vote(poll["event_id"], ["main"]), "org.matrix.msc3381.poll.response")
    notice = await alice.wait_notice(room, late)
    assert notice["content"][OUTCOME]["reason"] == "question_closed"


# ---------------------------------------------------------------- replies


async def test_replies_by_number_numbers_ids_and_free_text(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    await alice.send(room, element_reply(questions[("risk", 1)], "3", bot))
    await alice.send(room, element_reply(questions[("platforms", 1)], "1, 2", bot))
    await alice.send(room, element_reply(questions[("order", 1)], "leak, typo, crash", bot))
    await alice.send(room, element_reply(questions[("name", 1)], "Borealis", bot))
    risk = await bridge.wait_answer("kinds", "risk")
    assert (risk["choice"], risk["source"]["how"]) == ("high", "reply")
    assert (await bridge.wait_answer("kinds", "platforms"))["choices"] == ["linux", "mac"]
    assert (await bridge.wait_answer("kinds", "order"))["order"] == ["leak", "typo", "crash"]
    assert (await bridge.wait_answer("kinds", "name"))["text"] == "Borealis"


async def test_an_unreadable_reply_gets_help_and_records_nothing(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    sent = await alice.send(room, element_reply(questions[("risk", 1)], "hmm, the second-ish one?",
                                                bridge.bot["user_id"]))
    notice = await alice.wait_notice(room, sent)
    assert notice["content"][OUTCOME]["reason"] == "unreadable_reply"
    assert "Reply with the number" in notice["content"]["body"]
    assert notice["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == sent
    assert record(bridge, "risk") is None


# ---------------------------------------------------------------- reactions, edits, redactions


async def test_a_keycap_reaction_picks_and_redacting_it_withdraws(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    reaction = await alice.send(room, {"m.relates_to": {"rel_type": "m.annotation",
                                                        "event_id": questions[("ship", 1)]["event_id"],
                                                        "key": "2\ufe0f\u20e3"}}, "m.reaction")
    got = await bridge.wait_answer("kinds", "ship")
    assert (got["choice"], got["source"]["how"]) == ("wait", "reaction")
    await alice.redact(room, reaction)
    await until(lambda: record(bridge, "ship") is None, what="the redacted reaction withdrawing the answer")


async def test_an_edit_replaces_and_a_redaction_withdraws(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    first = await alice.send(room, element_reply(questions[("branch", 1)], "1", bot))
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "main"
    await alice.send(room, element_edit(first, "2"))
    edited = await bridge.wait_answer("kinds", "branch", rev=2)
    assert (edited["choice"], edited["source"]["how"]) == ("stable", "edit")
    # Element's "Remove" redacts the original event: its edits go with it.
    await alice.redact(room, first)
    await until(lambda: record(bridge, "branch") is None, what="the redaction withdrawing the answer")


async def test_a_redaction_falls_back_to_the_previous_answer(bridge):
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    await alice.send(room, element_reply(questions[("risk", 1)], "low", bot))
    await bridge.wait_answer("kinds", "risk")
    second = await alice.send(room, element_reply(questions[("risk", 1)], "mid", bot))
    await bridge.wait_answer("kinds", "risk", rev=2)
    await alice.redact(room, second)
    await until(lambda: (record(bridge, "risk") or {}).get("choice") == "low", what="falling back to the first pick")


# ---------------------------------------------------------------- notes, timecodes, files


async def test_a_note_with_a_timecode_and_a_picture_in_the_thread(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    takes = questions[("takes", 1)]
    await alice.send(room, element_thread(takes, {"msgtype": "m.text", "body": "1"}))
    assert (await bridge.wait_answer("kinds", "takes"))["choice"] == "t2"
    note = await alice.send(room, element_thread(takes, {"msgtype": "m.text",
                                                         "body": "keep the shaft thin\n1.4 s: the arrow jumps"}))
    await alice.wait_notice(room, note)
    data = png()
    upload, _ = await alice.client.upload(io.BytesIO(data), content_type="image/png", filename="shot.png",
                                          filesize=len(data))
    assert isinstance(upload, UploadResponse), upload
    picture = await alice.send(room, element_thread(takes, {
        "msgtype": "m.image", "body": "shot.png", "url": upload.content_uri,
        "info": {"mimetype": "image/png", "size": len(data), "w": 3, "h": 2}}))
    notice = await alice.wait_notice(room, picture)
    assert notice["content"][OUTCOME]["outcome"] == "recorded", notice["content"]["body"]

    got = record(bridge, "takes")
    assert got["choice"] == "t2" and got["note"] == "keep the shaft thin"
    assert got["timecodes"] == [{"t": 1.4, "text": "the arrow jumps"}]
    assert got["attachments"] == ["attachments/takes-1.png"]
    saved = bridge.sets_root / "kinds" / "attachments" / "takes-1.png"
    assert saved.read_bytes() == data
    view = {a["qid"]: a for a in read_set(bridge.sets_root / "kinds")["answers"]}
    assert view["takes"]["attachments"] == [str(saved.resolve())]


async def test_a_note_without_a_pick_is_note_only(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    await alice.send(room, element_thread(questions[("risk", 1)], {"msgtype": "m.text", "body": "depends on QA"}))
    got = await bridge.wait_answer("kinds", "risk")
    assert (got["state"], got["note"]) == ("note_only", "depends on QA")


# ---------------------------------------------------------------- a hostile set


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen.append((tag, attrs))


def hostile_set() -> dict[str, Any]:
    qset = all_kinds_set("kinds")
    q = qset["questions"][0]
    q["title"] = "<script>alert(1)</script> Release branch"
    q["why"] = "See [the plan](https://evil.example) <img src=x onerror=alert(2)>"
    q["options"][0]["label"] = "<b>main</b> [click](javascript:alert(3))"
    q["options"][1]["consequence"] = "<a href='https://evil.example'>Two fixes</a> wait"
    return qset


async def test_a_hostile_set_renders_escaped(bridge):
    questions = await started(bridge, hostile_set())
    branch = questions[("branch", 1)]["content"]
    html = branch["formatted_body"]
    tags = Tags()
    tags.feed(html)
    # Only the renderer's own tags, and no attribute but the spoiler marker.
    # (hr: the rule that opens every question, kept by Element's sanitiser.)
    assert {t for t, _ in tags.seen} <= {"h4", "p", "ol", "ul", "li", "blockquote", "strong", "em", "code", "br",
                                         "span", "hr"}
    assert all(name == "data-mx-spoiler" for _, attrs in tags.seen for name, _value in attrs)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;main&lt;/b&gt; [click](javascript:alert(3))" in html
    assert branch["question"]["title"] == "<script>alert(1)</script> Release branch"
    poll = (await polls(bridge.alice, bridge.room_id))[questions[("branch", 1)]["event_id"]]
    labels = [a["org.matrix.msc1767.text"] for a in poll["content"][POLL_START]["answers"]]
    assert labels[0] == "<b>main</b> [click](javascript:alert(3))"  # plain text: Element shows it as typed


# ---------------------------------------------------------------- media on questions


async def test_question_media_is_uploaded_once_and_posted_in_the_thread(bridge):
    from helpers.harness import EXAMPLES

    bridge.add_set(EXAMPLES / "release-decisions", name="release")
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    migration, splash = questions[("migration", 1)], questions[("splash", 1)]
    image = migration["content"]["question"]["media"][0]
    assert image["url"].startswith("mxc://") and image["mimetype"] == "image/png" and image["size"] > 0
    assert image["w"] > 0 and image["h"] > 0
    video = splash["content"]["question"]["media"][0]
    assert video["url"].startswith("mxc://") and video["mimetype"] == "video/mp4"

    def in_thread_of(events: list[dict[str, Any]], root: str) -> list[dict[str, Any]]:
        return [e for e in events if e.get("type") == "m.room.message"
                and e["content"].get("m.relates_to", {}).get("event_id") == root
                and e["content"].get("msgtype") in ("m.image", "m.video", "m.audio", "m.file")]

    deadline = time.monotonic() + 20
    while True:
        events = await bridge.alice.messages(bridge.room_id)
        # The question's own image, not the one its one-pager shows too.
        pictures = [e for e in in_thread_of(events, migration["event_id"])
                    if e["content"]["body"] == "p95 latency on staging during the online migration"]
        clips = in_thread_of(events, splash["event_id"])
        if pictures and len(clips) >= 2:
            break
        assert time.monotonic() < deadline, "the media were not posted in the threads"
        await asyncio.sleep(0.2)
    picture = pictures[0]["content"]
    assert picture["msgtype"] == "m.image" and picture["url"] == image["url"]
    assert picture["body"] == "p95 latency on staging during the online migration"
    assert picture["info"]["mimetype"] == "image/png" and picture["info"]["w"] == image["w"]
    kinds = sorted(c["content"]["msgtype"] for c in clips)
    assert kinds == ["m.file", "m.video"]
    vtt = next(c["content"] for c in clips if c["content"]["msgtype"] == "m.file")
    assert vtt["filename"] == "splash_pair.vtt"


# ---------------------------------------------------------------- a study set


async def test_a_quiz_says_right_or_wrong_and_scores_by_topic_when_done(bridge):
    from helpers.harness import EXAMPLES

    bridge.add_set(EXAMPLES / "study-basics", name="study")
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 5)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]

    def number_of(qid: str, option_id: str) -> str:
        options = [o["id"] for o in questions[(qid, 1)]["content"]["question"]["options"]]
        return str(options.index(option_id) + 1)

    # The posted event never gives the answer away.
    assert all("correct" not in o for e in questions.values() for o in e["content"]["question"]["options"])
    right = await alice.send(room, element_reply(questions[("room-id", 1)], number_of("room-id", "bang"), bot))
    wrong = await alice.send(room, element_reply(questions[("event-size", 1)], number_of("event-size", "m1"), bot))
    assert "Right. Room ids start with !" in (await alice.wait_notice(room, right))["content"]["body"]
    body = (await alice.wait_notice(room, wrong))["content"]["body"]
    assert "Not quite. That is a common upload limit" in body and "“64 KiB”" in body
    await alice.send(room, element_reply(questions[("reply-word", 1)], number_of("reply-word", "lower"), bot))
    await alice.send(room, element_reply(questions[("alias", 1)], "A name that points at a room", bot))
    last = await alice.send(room, element_reply(questions[("since", 1)], "The token of the last sync", bot))
    assert "stored for grading" in (await alice.wait_notice(room, last))["content"]["body"]

    deadline = time.monotonic() + 20
    while True:
        scores = [e for e in await alice.messages(room) if "dev.superpipeline.quiz.score" in e.get("content", {})]
        if scores:
            break
        assert time.monotonic() < deadline, "no score was posted"
        await asyncio.sleep(0.2)
    text = scores[0]["content"]["body"]
    assert "1 of 3" in text  # room-id (1 point) right, event-size (2 points) wrong
    assert "- rooms: 1 of 1" in text and "- events: 0 of 2" in text
    assert "Bonus questions: 1 of 1" in text and "2 written answers wait for grading" in text
    # The same pick sent again is the score that stands: it was posted again,
    # "This replaces the earlier score: an answer changed."
    again = await alice.send(room, element_reply(questions[("room-id", 1)], number_of("room-id", "bang"), bot))
    await alice.wait_notice(room, again)
    await asyncio.sleep(2)
    assert len([e for e in await alice.messages(room) if "dev.superpipeline.quiz.score" in e.get("content", {})]) == 1


async def test_a_moderator_the_bridges_own_account_made_may_take_an_answer_back(bridge, synapse, person):
    # In bot mode the bridge's account made the room and is its admin: it
    # raised Carol to moderator, and her redaction of Alice's answer was
    # ignored ("no power to redact others"): the bridge left its own events
    # out of what it read, its power levels with them.
    from bridge.devserver import _http_json
    from urllib.parse import quote

    carol = person()
    synapse.invite(bridge.bot["access_token"], bridge.room_id, carol.user_id)
    synapse.join(carol.token, bridge.room_id)
    questions = await started(bridge)
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    answered = await alice.send(room, element_reply(questions[("risk", 1)], "low", bot))
    await bridge.wait_answer("kinds", "risk")
    levels_url = f"{synapse.url}/_matrix/client/v3/rooms/{quote(room, safe='')}/state/m.room.power_levels"
    levels = _http_json("GET", levels_url, None, bridge.bot["access_token"])
    levels["users"] = {**levels.get("users", {}), carol.user_id: 50}
    _http_json("PUT", levels_url, levels, bridge.bot["access_token"])
    await asyncio.sleep(1)  # the bridge has read the change (its next sync)
    await carol.redact(room, answered)
    await until(lambda: record(bridge, "risk") is None, what="the moderator's redaction withdrawing the answer")
