"""A set folder that refuses writes, at the pipeline: the answer is kept in
the store but not acknowledged, the set is held back on its own while the
transport's progress moves on, and the answer is written and acknowledged
once the folder takes the write."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import bridge.answers.file as answers_file
from bridge.protocol.normalize import ANSWER_TYPE
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.model import QuestionSet
from bridge.service.answering.notices import Notices
from bridge.service.answering.pipeline import Pipeline
from bridge.service.storage.store import Store
from helpers.sets import all_kinds_set

ROOM, ALICE, BOT = "!room:hs", "@alice:hs", "@bot:hs"


class Transport:
    user_id = BOT

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        self.sent.append(content)
        return f"$sent{len(self.sent)}"

    async def joined_members(self, room_id: str) -> set[str]:
        return {ALICE, BOT}


def _posted(tmp_path: Path) -> tuple[Path, Store]:
    """A set folder whose text question ``name`` is posted as $q, and the store."""
    set_dir = tmp_path / "kinds"
    set_dir.mkdir()
    qset = QuestionSet.model_validate(all_kinds_set("kinds"))
    question = next(q for q in qset.questions if q.id == "name")
    posted = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds",
                              content=build_question_event(qset, question, elicitation_id="elc_name"))
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.record_posted(posted, set_dir=str(set_dir), posted_at=1)
    return set_dir, store


@pytest.mark.usefixtures("store_backend")
def test_an_answer_the_folder_refuses_is_neither_acknowledged_nor_committed(tmp_path: Path, monkeypatch) -> None:
    set_dir, store = _posted(tmp_path)
    transport = Transport()
    pipeline = Pipeline(store=store, transport=transport, answerers=None, own_users=lambda u: u == BOT)
    asyncio.run(pipeline.load_members(ROOM))
    answer = {"type": "m.room.message", "event_id": "$a", "room_id": ROOM, "sender": ALICE, "origin_server_ts": 1,
              "content": {"msgtype": "m.text", "body": "Borealis", "suite_event_type": ANSWER_TYPE,
                          "elicitation_id": "elc_name", "text": "Borealis",
                          "m.relates_to": {"rel_type": "m.reference", "event_id": "$q"}}}
    committed: list[str] = []

    def refuse(_path: Path, _data: bytes) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(answers_file, "replace_whole", refuse)
    pipeline.process([answer], commit=lambda: committed.append("token"))
    assert committed == ["token"]  # the transport moves on: the answer is durable in the store
    notices = Notices(pipeline, asyncio.Event())
    assert asyncio.run(notices.send_pending()) == 0 and transport.sent == []
    assert not (set_dir / "answers.json").exists()
    [(held_dir, _set_id, reason, _since, attempts, _next)] = store.held_sets()
    assert held_dir == str(set_dir) and "Read-only" in reason and attempts == 1

    monkeypatch.undo()
    store.db.execute("UPDATE held_set SET next_try=0")  # due now, as it would be after the backoff
    assert pipeline.retry_held() is False
    assert answers_file.AnswersFile(set_dir).load()["answers"]["name"]["text"] == "Borealis"
    assert asyncio.run(notices.send_pending()) == 1
    assert transport.sent[0]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert store.held_sets() == []
    store.close()


@pytest.mark.usefixtures("store_backend")
def test_an_answer_to_a_set_whose_folder_is_removed_under_it_is_not_held_for_good(tmp_path: Path) -> None:
    # The agent deleted the set folder right as the person answered: the
    # answer was held with "the set folder is gone" for good (/health's
    # sets_held 1, status listing it), though the set was removed and its
    # questions closed as such; a folder put back was never freed of it.
    import shutil

    set_dir, store = _posted(tmp_path)
    transport = Transport()
    pipeline = Pipeline(store=store, transport=transport, answerers=None, own_users=lambda u: u == BOT)
    asyncio.run(pipeline.load_members(ROOM))
    shutil.rmtree(set_dir)  # gone between the answer's arrival and its write
    answer = {"type": "m.room.message", "event_id": "$a", "room_id": ROOM, "sender": ALICE, "origin_server_ts": 1,
              "content": {"msgtype": "m.text", "body": "Borealis", "suite_event_type": ANSWER_TYPE,
                          "elicitation_id": "elc_name", "text": "Borealis",
                          "m.relates_to": {"rel_type": "m.reference", "event_id": "$q"}}}
    pipeline.process([answer], commit=lambda: None)
    # Not closed yet (the poster's pass comes): held, as a folder moved away and back would be.
    assert [row[2] for row in store.held_sets()] == ["the set folder is gone"]
    with store.transaction():
        store.close_question("$q", "set removed")  # the poster's pass: the set was removed
    store.db.execute("UPDATE held_set SET next_try=0")
    pipeline.retry_held()
    assert store.held_sets() == [] and not set_dir.exists()
    # The word back does not leave the person thinking the agent has it.
    assert asyncio.run(Notices(pipeline, asyncio.Event()).send_pending()) == 1
    assert "its set was removed before it could be written there: the agent that asked does not get it" \
        in transport.sent[0]["body"]
    store.close()
