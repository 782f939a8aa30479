"""The record is what the room's timeline says, against a real Synapse:
authorship of edits, redacting an edit, withdrawn notes and files, and
postings that belong to their set folder."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from functools import partial
from typing import Any

import pytest
from nio import UploadResponse

from helpers.harness import answer_content, question_posts
from helpers.sets import all_kinds_set
from helpers.waiting import until

pytestmark = pytest.mark.integration

OUTCOME = "dev.superpipeline.question.outcome"
CLOSED = "dev.superpipeline.question.closed"


until = partial(until, every=0.1)


def one_choice_set(set_id: str = "takes", rev: int = 1, qid: str = "branch") -> dict[str, Any]:
    return {"askwright": 1, "id": set_id, "title": "Takes", "questions": [
        {"id": qid, "kind": "choice", "rev": rev, "title": "Release branch", "question": "Which branch?",
         "why": "The cut is due.", "options": [{"id": "main", "label": "The main branch"},
                                               {"id": "stable", "label": "The stable branch"}],
         "guess": {"option": "main", "why": "It is ready.", "confidence": "low"}}]}


def answer_edit(question: dict[str, Any], original: str, option: str) -> dict[str, Any]:
    new = answer_content(question, option_id=option)
    del new["m.relates_to"]
    return {"msgtype": "m.text", "body": f" * {option}", "m.new_content": new,
            "m.relates_to": {"rel_type": "m.replace", "event_id": original}}


def in_thread(question: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    root = question["event_id"]
    return {**content, "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                        "m.in_reply_to": {"event_id": root}}}


async def second_person(bridge, person, synapse):
    """The same room, one more member."""
    bob = person()
    synapse.invite(bridge.bot["access_token"], bridge.room_id, bob.user_id)
    synapse.join(bob.token, bridge.room_id)
    return bob


async def test_an_edit_from_someone_else_does_not_change_the_answer(bridge, person, synapse):
    bob = await second_person(bridge, person, synapse)
    bridge.add_set(one_choice_set())
    bridge.start()
    question = (await bridge.wait_questions(bridge.alice, 1))[("branch", 1)]
    room = bridge.room_id
    original = await bridge.alice.send(room, answer_content(question, option_id="main"))
    await bridge.alice.wait_notice(room, original)
    forged = await bob.send(room, answer_edit(question, original, "stable"))
    own = await bridge.alice.send(room, answer_content(question, option_id="main"))  # a marker after it
    await bridge.alice.wait_notice(room, own)
    record = bridge.answers("takes")["answers"]["branch"]
    assert record["choice"] == "main" and record["source"]["sender"] == bridge.alice.user_id
    assert await bob.notices_for(room, forged) == []


async def test_redacting_an_edit_brings_the_answer_before_it_back(bridge):
    bridge.add_set(one_choice_set())
    bridge.start()
    question = (await bridge.wait_questions(bridge.alice, 1))[("branch", 1)]
    alice, room = bridge.alice, bridge.room_id
    original = await alice.send(room, answer_content(question, option_id="main"))
    await alice.wait_notice(room, original)
    changed = await alice.send(room, answer_edit(question, original, "stable"))
    await alice.wait_notice(room, changed)
    assert bridge.answers("takes")["answers"]["branch"]["choice"] == "stable"
    await alice.redact(room, changed)
    record = await until(lambda: (r := bridge.answers("takes")["answers"].get("branch")) and
                         r["choice"] == "main" and r, what="the original answer back")
    assert record["source"]["event_id"] == original


async def test_a_withdrawn_note_and_file_leave_answers_json_and_the_disk(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    alice, room = bridge.alice, bridge.room_id
    takes = questions[("takes", 1)]
    first = await alice.send(room, answer_content(takes, option_id="t2"))
    await alice.wait_notice(room, first)
    secret = await alice.send(room, in_thread(takes, {"msgtype": "m.text", "body": "the password is hunter2"}))
    await alice.wait_notice(room, secret)
    data = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    upload, _ = await alice.client.upload(io.BytesIO(data), content_type="image/png", filename="key.png",
                                          filesize=len(data))
    assert isinstance(upload, UploadResponse), upload
    picture = await alice.send(room, in_thread(takes, {"msgtype": "m.image", "body": "key.png", "url": upload.content_uri,
                                                       "info": {"mimetype": "image/png", "size": len(data)}}))
    await alice.wait_notice(room, picture)
    later = await alice.send(room, answer_content(takes, option_id="t5"))  # a later pick
    await alice.wait_notice(room, later)
    record = bridge.answers("kinds")["answers"]["takes"]
    assert record["choice"] == "t5" and "hunter2" in record["note"] and len(record["attachments"]) == 1
    saved = bridge.sets_root / "kinds" / record["attachments"][0]
    assert saved.exists()

    await alice.redact(room, secret)
    await alice.redact(room, picture)
    record = await until(lambda: (r := bridge.answers("kinds")["answers"]["takes"]) and "note" not in r
                         and "attachments" not in r and r, what="note and file gone")
    assert record["choice"] == "t5"
    await until(lambda: not saved.exists(), what="the file deleted")
    assert "hunter2" not in (bridge.sets_root / "kinds" / "answers.json").read_text()


async def test_a_second_folder_with_the_same_set_id_is_refused_and_the_first_untouched(bridge):
    first = bridge.add_set(one_choice_set(), name="a-takes")
    second = bridge.add_set(one_choice_set(qid="other"), name="b-takes")
    bridge.start()
    question = (await bridge.wait_questions(bridge.alice, 1))[("branch", 1)]
    alice, room = bridge.alice, bridge.room_id
    await until(lambda: "is already the id of the set in" in bridge.log_text(), what="the refusal logged")
    answer = await alice.send(room, answer_content(question, option_id="main"))
    await alice.wait_notice(room, answer)
    assert bridge.answers("a-takes")["answers"]["branch"]["choice"] == "main"
    assert not (second / "answers.json").exists()
    assert [e["content"]["question"]["id"] for e in question_posts(await alice.messages(room))] == ["branch"]
    status = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(bridge.config_path), "--json"],
                            capture_output=True, text=True, check=True)
    rows = {row["set_dir"]: row for row in json.loads(status.stdout)["sets"]}
    problem = rows[str(second)]["problem"]
    assert str(first) in problem and str(second) in problem
    assert rows[str(first)]["problem"] is None


async def test_a_set_folder_removed_closes_its_questions_and_posts_them_again_when_back(bridge, tmp_path):
    folder = bridge.add_set(one_choice_set())
    bridge.start()
    question = (await bridge.wait_questions(bridge.alice, 1))[("branch", 1)]
    alice, room = bridge.alice, bridge.room_id
    shutil.move(str(folder), str(tmp_path / "archived"))

    async def closed() -> bool:
        return any(e.get("content", {}).get(CLOSED, {}).get("why") == "this set was removed"
                   for e in await alice.messages(room))
    await until(closed, what="the room told the set was removed")
    late = await alice.send(room, answer_content(question, option_id="main"))
    notice = await alice.wait_notice(room, late)
    assert notice["content"][OUTCOME]["outcome"] != "recorded"
    assert "this set was removed" in notice["content"]["body"]
    bridge.check_alive()

    shutil.move(str(tmp_path / "archived"), str(folder))  # the folder moved back, as it was

    async def posted_again() -> list[dict[str, Any]]:
        posts = question_posts(await alice.messages(room))
        return posts if len(posts) == 2 else []
    posts = await until(posted_again, what="the question posted again")
    again = posts[-1]
    assert again["content"]["elicitation_id"] != question["content"]["elicitation_id"]
    answer = await alice.send(room, answer_content(again, option_id="stable"))
    await alice.wait_notice(room, answer)
    assert bridge.answers("takes")["answers"]["branch"]["choice"] == "stable"


async def test_a_removed_sets_last_question_takes_no_answer_while_the_room_is_told(bridge, tmp_path):
    """The store closes every question of a removed set at once: closed one
    by one (a message each), the last questions of a large set took answers
    meanwhile, acknowledged "Recorded" and written nowhere."""
    from helpers.attack import text_set

    count = 40
    folder = bridge.add_set(text_set("many", count))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, count)
    alice, room = bridge.alice, bridge.room_id
    shutil.move(str(folder), str(tmp_path / "archived"))

    async def first_closed() -> bool:
        return any(e.get("content", {}).get(CLOSED, {}).get("why") == "this set was removed"
                   for e in await alice.messages(room, limit=20))
    await until(first_closed, what="the room told of the first question closed", every=0.02)
    late = await alice.send(room, answer_content(questions[(f"q{count - 1}", 1)], text="late"))
    notice = await alice.wait_notice(room, late)
    assert notice["content"][OUTCOME]["outcome"] != "recorded", notice["content"]["body"]
    assert "this set was removed" in notice["content"]["body"]


async def test_a_rev_that_goes_back_is_posted_anew_and_answers_to_it_land(bridge):
    folder = bridge.add_set(one_choice_set(rev=1))
    bridge.start()
    alice, room = bridge.alice, bridge.room_id
    await bridge.wait_questions(alice, 1)
    (folder / "questions.json").write_text(json.dumps(one_choice_set(rev=2)))
    await until(lambda: "rev 2" in bridge.log_text() and "question posted" in bridge.log_text(),
                what="rev 2 posted")
    (folder / "questions.json").write_text(json.dumps(one_choice_set(rev=1)))

    async def three_posts() -> list[dict[str, Any]]:
        posts = question_posts(await alice.messages(room))
        return posts if len(posts) == 3 else []
    posts = await until(three_posts, what="rev 1 posted again")
    assert [p["content"]["question"]["rev"] for p in posts] == [1, 2, 1]
    assert len({p["content"]["elicitation_id"] for p in posts}) == 3
    assert "rev went back from 2 to 1" in bridge.log_text()
    # Linting the set with the bridge's config says so too, and so does status:
    # rev 2 was posted, the file says 1.
    for command in (["lint", "--json", "--no-probe", "-c", str(bridge.config_path), str(folder)],
                    ["status", "-c", str(bridge.config_path), "--json"]):
        done = subprocess.run([sys.executable, "-m", "bridge", *command], capture_output=True, text=True, check=True)
        assert "rev went back from 2 to 1" in done.stdout, done.stdout
    answer = await alice.send(room, answer_content(posts[-1], option_id="main"))
    notice = await alice.wait_notice(room, answer)
    assert notice["content"][OUTCOME]["outcome"] == "recorded", notice["content"]["body"]
    stale = await alice.send(room, answer_content(posts[1], option_id="main"))
    assert (await alice.wait_notice(room, stale))["content"][OUTCOME]["outcome"] != "recorded"


async def test_a_newer_record_another_writer_put_there_survives_a_redaction_and_an_older_answer(bridge):
    folder = bridge.add_set(one_choice_set())
    bridge.start()
    question = (await bridge.wait_questions(bridge.alice, 1))[("branch", 1)]
    alice, room = bridge.alice, bridge.room_id
    first = await alice.send(room, answer_content(question, option_id="main"))
    await alice.wait_notice(room, first)
    # askwright's own page takes a newer answer, under the same lock.
    from bridge.answers.document import put_record
    from bridge.answers.file import AnswersFile

    page = {"qid": "branch", "choice": "stable", "q_rev": 1, "rev": 7, "source": {"via": "page", "who": "ann"}}
    AnswersFile(folder).update(lambda doc, now: put_record(doc, page, now), "2026-11-30T12:00:00.000Z")
    await alice.redact(room, first)
    await until(lambda: "kept the record written by via page" in bridge.log_text(), what="the conflict logged")
    record = bridge.answers("takes")["answers"]["branch"]
    assert record["choice"] == "stable" and record["source"]["via"] == "page"
    second = await alice.send(room, answer_content(question, option_id="main"))  # rev 2 < 7
    await alice.wait_notice(room, second)
    assert bridge.answers("takes")["answers"]["branch"]["source"]["via"] == "page"


async def test_a_folder_refused_for_its_set_id_is_posted_once_the_folder_holding_the_id_goes(bridge, tmp_path):
    """The second folder, written while the bridge ran, was refused; the
    first was then moved away and its questions closed, but the second was
    never posted (nothing in it changed to wake the watcher) until a restart."""
    first = bridge.add_set(one_choice_set(), name="a-takes")
    bridge.start()
    alice = bridge.alice
    await bridge.wait_questions(alice, 1)
    bridge.add_set(one_choice_set(qid="other"), name="b-takes")
    await until(lambda: "is already the id of the set in" in bridge.log_text(), what="the refusal logged")
    shutil.move(str(first), str(tmp_path / "archived"))
    assert ("other", 1) in await bridge.wait_questions(alice, 2, timeout=30)


async def test_a_revision_written_to_the_file_a_symlinked_questions_json_names_is_posted(bridge):
    """questions.json a link to questions.v2.json beside it (the bridge takes
    such a set): the agent replacing questions.v2.json with rev 3 was never
    noticed, only a change of the link itself."""
    import asyncio
    import os

    folder = bridge.sets_root / "takes"
    folder.mkdir(parents=True)
    (folder / "questions.v2.json").write_text(json.dumps(one_choice_set(rev=2)))
    os.symlink("questions.v2.json", folder / "questions.json")
    bridge.start()
    assert ("branch", 2) in await bridge.wait_questions(bridge.alice, 1)
    await asyncio.sleep(3)  # the start's second pass over the sets done, the watcher up
    (folder / "questions.v2.tmp").write_text(json.dumps(one_choice_set(rev=3)))
    os.rename(folder / "questions.v2.tmp", folder / "questions.v2.json")
    assert ("branch", 3) in await bridge.wait_questions(bridge.alice, 2, timeout=20)
