"""On PostgreSQL a batch takes what the batch before knew (the postings its
answers name, their questions' counts) and takes its events as new, instead
of reading them, and sends one condition that all of it still holds with its
writes (``bridge/service/storage/guesses.py``): an answer to a question
being answered waits for the database once before answers.json is written.
Whatever changed meanwhile, by a writer the batch did not see, fails that
condition on the server, and the batch is handled again from reads: the
outcome is the one reading would give, on both backends."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bridge.protocol.recorded import RecordedQuestion
from test_isolation_parts import BOB, ROOM, answer, setup

pytestmark = pytest.mark.usefixtures("store_backend")  # on SQLite and on PostgreSQL


def records(folder: Path) -> dict:
    return json.loads((folder / "answers.json").read_text())["answers"]["name"]


def outcome(store, event_id: str) -> str | None:
    row = store.db.execute("SELECT outcome FROM answer_log WHERE event_id=?", (event_id,)).fetchone()
    return row[0] if row else None


def test_a_question_closed_by_a_writer_the_batch_did_not_see_refuses_the_answer(tmp_path):
    store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$first", "Borealis")])
    # Not through the store's own calls: the batch before's memo does not hear of it.
    store.db.execute("UPDATE posted SET open=0, closed_why='withdrawn' WHERE event_id='$q0'")
    pipeline.process([answer(0, "$late", "Australis", sender=BOB)])
    assert outcome(store, "$late") == "refused"
    assert "Australis" not in json.dumps(records(folders[ROOM]))


def test_an_event_another_writer_handled_is_not_handled_again(tmp_path):
    store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$first", "Borealis")])
    store.db.execute("INSERT INTO processed(event_id, outcome) VALUES ('$elsewhere', 'accepted')")
    result = pipeline.process([answer(0, "$elsewhere", "Australis", sender=BOB),
                               answer(0, "$new", "Aurora", sender=BOB)])
    assert result.skipped == 1
    assert outcome(store, "$elsewhere") is None and outcome(store, "$new") == "accepted"
    assert records(folders[ROOM])["rev"] == 2


def test_a_count_changed_by_a_writer_the_batch_did_not_see_is_read_again(tmp_path):
    """A question's accepted count numbers its next answer (the record's
    rev): the count taken from the batch before is part of the condition."""
    store, pipeline, _transport, _folders = setup(tmp_path)
    pipeline.process([answer(0, "$first", "Borealis"), answer(0, "$second", "Aurora", sender=BOB)])
    store.db.execute("UPDATE answer_log SET outcome='refused' WHERE event_id='$second'")
    pipeline.process([answer(0, "$next", "Australis", sender=BOB)])
    record = store.db.execute("SELECT record FROM answer_log WHERE event_id='$next'").fetchone()[0]
    assert json.loads(record)["rev"] == 2  # one accepted before it, as reading the log says


def posted_again(store, n: int, like: str) -> None:
    """The question of posting ``like`` posted again in its set folder, as ``$q<n>`` (elicitation ``elc_<n>``)."""
    first = store.question_by_event(like)
    content = {**first.content, "elicitation_id": f"elc_{n}"}
    store.record_posted(RecordedQuestion(event_id=f"$q{n}", room_id=ROOM, set_id=first.set_id, content=content),
                        set_dir=store.set_dir_of(like), posted_at=2)


def test_a_posting_the_bridge_made_is_taken_with_the_count_its_question_had(tmp_path, caplog):
    """What the bridge recorded of its own posting (the question's count
    read beside it) numbers the first answer to it, as reading would, and
    holds on the server: the batch is not handled again."""
    store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$first", "Borealis"), answer(0, "$second", "Aurora", sender=BOB)])
    with store.transaction():
        posted_again(store, 7, "$q0")
    caplog.set_level(logging.INFO, logger="bridge.service.answering.pipeline")
    pipeline.process([answer(7, "$third", "Australis")])
    assert outcome(store, "$third") == "accepted" and records(folders[ROOM])["rev"] == 3
    assert "took for granted" not in caplog.text


def test_a_posting_the_bridge_made_then_closed_by_another_writer_refuses_the_answer(tmp_path):
    store, pipeline, _transport, folders = setup(tmp_path)
    with store.transaction():
        posted_again(store, 7, "$q0")
    store.db.execute("UPDATE posted SET open=0, closed_why='withdrawn' WHERE event_id='$q7'")
    pipeline.process([answer(7, "$late", "Australis")])
    assert outcome(store, "$late") == "refused"


def test_a_posting_whose_transaction_was_rolled_back_is_not_taken(tmp_path):
    store, pipeline, _transport, _folders = setup(tmp_path)
    with pytest.raises(RuntimeError), store.transaction():
        posted_again(store, 7, "$q0")
        raise RuntimeError("the posting's send failed")
    pipeline.process([answer(7, "$orphan", "Australis")])
    assert outcome(store, "$orphan") != "accepted" and store.question_by_event("$q7") is None
