"""Study sets in the room: the word back on each quiz answer and, once every
question is answered, the score by topic.

The verdict needs ``correct`` and each option's ``why``, which the posted
event never carries, so they are read from the set's current
``questions.json`` when the notice is sent (outside any store transaction).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.protocol.outcome import notice, txn_id
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.study import complete, counted, feedback, score, score_html, score_text
from bridge.questionset.setdir import QUESTIONS_FILE, read_questions
from bridge.service.storage.store import LogEntry, Store

if TYPE_CHECKING:
    from bridge.questionset.model import QuestionSet

log = logging.getLogger(__name__)


def load(set_dir: str | None) -> QuestionSet | None:
    if not set_dir:
        return None
    from bridge.questionset.model import QuestionSet  # pydantic: only once a study set is answered

    try:
        return QuestionSet.model_validate(read_questions(str(Path(set_dir) / QUESTIONS_FILE)))
    except Exception:  # noqa: BLE001 - a broken file only costs the feedback, never the answer
        log.warning("could not read %s for quiz feedback", set_dir)
        return None


def is_study(question: RecordedQuestion) -> bool:
    set_info = question.content.get("set")
    return isinstance(set_info, dict) and set_info.get("mode") == "study"


def feedback_for(entry: LogEntry, question: RecordedQuestion) -> str | None:
    if not is_study(question) or entry.record is None:
        return None
    qset = load(entry.set_dir)
    return feedback(qset.question(question.qid or "") if qset else None, entry.record)


async def send_score_if_complete(entry: LogEntry, store: Store, transport: Any) -> None:
    """Post the score once per complete set of answers (a changed answer re-scores).
    What it reads and writes of the store are jobs on the store's thread."""
    due = await store.run(_score_due, entry, store)
    if due is None:
        return
    content, key, mark = due
    await transport.send(entry.room_id, "m.room.message", content, txn_id("score", key))
    await store.run(_scored, store, mark)


def _score_due(entry: LogEntry, store: Store) -> tuple[dict[str, Any], str, tuple[str, str]] | None:
    """The score to post after ``entry``, its key, and the mark it leaves;
    None when there is none (yet, or any more)."""
    question = store.question_by_event(entry.question_event_id) if entry.question_event_id else None
    if question is None or not is_study(question) or not entry.set_dir:
        return None
    qset = load(entry.set_dir)
    if qset is None:
        return None
    answers = {q.id: store.projection(entry.set_dir, q.id) or {} for q in qset.open_questions}
    if not complete(qset, answers):
        return None
    # What the score is made of: the same picks again (an answer sent twice)
    # is the score that stands, not a new one; picks changed, and changed
    # back, are a new score each time (counted, so each has its own key).
    picks = hashlib.sha256(json.dumps({qid: [a.get("choice"), a.get("choices"), a.get("order"), a.get("text"),
                                             a.get("q_rev")] for qid, a in counted(qset, answers).items()},
                                      sort_keys=True).encode()).hexdigest()
    # One score per set stands: a later one (an answer changed) says it replaces it.
    scored = "scored:" + hashlib.sha256(entry.set_dir.encode()).hexdigest()[:32]
    last = store.get_meta(scored)
    posted, _, last_picks = (last or "0 ").partition(" ")
    if last_picks == picks:
        return None
    replaces = last is not None
    count = int(posted) + 1 if posted.isdigit() else 1
    key = "score:" + hashlib.sha256(f"{entry.set_dir}\x00{count}\x00{picks}".encode()).hexdigest()[:32]
    result = score(qset, answers)
    content = notice(score_text(qset, result, replaces), entry.question_event_id or entry.event_id, {})
    content["formatted_body"] = score_html(qset, result, replaces)
    content.pop("dev.superpipeline.question.outcome", None)
    content["dev.superpipeline.quiz.score"] = {"set": qset.id}
    return content, key, (scored, f"{count} {picks}")


def _scored(store: Store, mark: tuple[str, str]) -> None:
    """The score posted is the one that stands: how many so far, and its picks."""
    with store.transaction():
        store.set_meta(*mark)
