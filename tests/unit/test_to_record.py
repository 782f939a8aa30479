"""Accepted answer -> answers.json record."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.protocol.judge import Accepted, IncomingAnswer, JudgeContext, judge
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.to_record import answer_note, matched_guess, to_record

NOW = "2026-11-30T12:00:00.000Z"
SOURCE = {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": "$e", "sender": "@p:hs", "ts": 1}
UNSURE = {"id": "unsure", "label": "Not sure, ask me later"}
OTHER = {"id": "other", "label": "Something else", "input": "required"}
TAKES = [{"id": "t2", "label": "Take 2"}, {"id": "t5", "label": "Take 5"}, {"id": "tie", "label": "Either is fine"}]


def question(kind: str = "compare", *, options: list[dict[str, Any]] | None = None, **q_extra: Any) -> RecordedQuestion:
    if options is None:
        options = [UNSURE] if kind == "text" else [*TAKES, UNSURE, OTHER]
    q = {"id": "arrow", "rev": 3, "kind": kind, "title": "The arrow", "question": "Which?", "options": options, **q_extra}
    content = {"msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.v2",
               "elicitation_id": "elc", "question": q}
    return RecordedQuestion(event_id="$q", room_id="!r", set_id="takes", content=content)


def accept(q: RecordedQuestion, **fields: Any) -> Accepted:
    content = {"msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.answer.v2",
               "elicitation_id": "elc", "m.relates_to": {"rel_type": "m.reference", "event_id": "$q"}, **fields}
    verdict = judge(q, IncomingAnswer("$e", "!r", "@p:hs", 1, content),
                    JudgeContext(allowed=None, members=frozenset({"@p:hs"}), bridge_user="@b:hs"))
    assert isinstance(verdict, Accepted), verdict
    return verdict


def record(q: RecordedQuestion, prior: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return to_record(q, accept(q, **fields), prior=prior, source=SOURCE, now=NOW)


GUESS_LOW = {"option": "t5", "why": "thinner", "confidence": "low"}


def test_compare_record_as_architecture_shows_it() -> None:
    q = question(sides={"left": "t2", "right": "t5", "randomized": True}, guess=GUESS_LOW)
    r = record(q, option_id="t2")
    assert r == {
        "qid": "arrow", "state": "answered", "choice": "t2", "label": "Take 2", "side": "left",
        "matched_guess": False, "q_rev": 3, "rev": 1, "updated": NOW, "source": SOURCE,
    }
    assert r["source"] is not SOURCE
    assert list(r) == ["qid", "state", "choice", "label", "side", "matched_guess", "q_rev", "rev", "updated", "source"]


def test_side_only_on_compare_and_only_for_a_sided_option() -> None:
    q = question(sides={"left": "t2", "right": "t5", "randomized": False})
    assert "side" not in record(q, option_id="tie")
    q = question("choice", sides={"left": "t2", "right": "t5"})
    assert "side" not in record(q, option_id="t2")


def test_matched_guess() -> None:
    q = question(guess=GUESS_LOW)
    assert record(q, option_id="t5")["matched_guess"] is True
    assert record(q, option_id="unsure")["matched_guess"] is False
    assert "matched_guess" not in record(question(), option_id="t5")


@pytest.mark.parametrize(("confidence", "expected"), [("high", True), ("low", None)])
def test_guess_revealed_before_pick(confidence: str, expected: bool | None) -> None:
    r = record(question(guess={"option": "t5", "confidence": confidence}), option_id="t2")
    assert r.get("guess_revealed_before_pick") is expected
    assert record(question(), option_id="t2")["guess_revealed_before_pick"] is False


def test_unsure_state() -> None:
    r = record(question(), option_id="unsure")
    assert (r["state"], r["choice"], r["label"]) == ("unsure", "unsure", "Not sure, ask me later")


def test_other_input_becomes_the_note_and_the_note_extension_is_appended() -> None:
    r = record(question(), option_id="other", text="a third take", note="and soon")
    assert (r["state"], r["choice"], r["label"]) == ("answered", "other", "Something else")
    assert r["note"] == "a third take\n\nand soon"
    assert "text" not in r


def test_multi_record() -> None:
    q = question("multi", guess={"options": ["t5", "t2"]})
    r = record(q, text="t2, t5")
    assert r["choices"] == ["t2", "t5"] and r["matched_guess"] is True and r["state"] == "answered"
    assert "choice" not in r and "text" not in r
    assert record(q, text="t2")["matched_guess"] is False


def test_rank_record() -> None:
    q = question("rank", guess={"order": ["t5", "t2", "tie"]})
    r = record(q, text="t5, t2, tie")
    assert r["order"] == ["t5", "t2", "tie"] and r["matched_guess"] is True
    assert record(q, text="t2, t5, tie")["matched_guess"] is False


def test_text_record() -> None:
    q = question("text", guess={"text": "Main  branch"})
    r = record(q, text="main branch", note="cut today")
    assert (r["state"], r["text"], r["note"], r["matched_guess"]) == ("answered", "main branch", "cut today", True)
    r = record(q, option_id="unsure", text="ask Bob")
    assert (r["state"], r["choice"], r["note"]) == ("unsure", "unsure", "ask Bob")
    assert "text" not in r


def test_rev_counts_answers() -> None:
    q = question()
    assert record(q, {"rev": 4, "choice": "t5"}, option_id="t2")["rev"] == 5
    assert record(q, {"rev": "x"}, option_id="t2")["rev"] == 1
    assert record(q, {"rev": True}, option_id="t2")["rev"] == 1


def test_prior_attachments_and_timecodes_stay() -> None:
    prior = {"rev": 1, "choice": "t5", "attachments": ["attachments/arrow-1.png"], "timecodes": [{"t": 1.4, "text": ""}]}
    r = record(question(), prior, option_id="t2")
    assert r["attachments"] == ["attachments/arrow-1.png"] and r["timecodes"] == [{"t": 1.4, "text": ""}]
    assert r["attachments"] is not prior["attachments"]


def test_prior_note_kept_only_when_the_new_answer_has_none() -> None:
    q = question()
    prior = {"rev": 1, "choice": "t5", "note": "keep the shaft thin"}
    assert record(q, prior, option_id="t2")["note"] == "keep the shaft thin"
    assert record(q, prior, option_id="t2", note="new words")["note"] == "new words"


def test_prior_note_that_was_an_options_input_is_dropped() -> None:
    prior = {"rev": 1, "choice": "other", "note": "a third take"}
    assert "note" not in record(question(), prior, option_id="t2")


def test_records_fit_the_answers_document() -> None:
    document = pytest.importorskip("bridge.answers.document")
    q = question(sides={"left": "t2", "right": "t5"}, guess={"option": "t5", "confidence": "high"})
    doc = document.empty("takes")
    for fields in ({"option_id": "t2"}, {"option_id": "unsure"}, {"option_id": "other", "text": "x", "note": "y"}):
        doc = document.put_record(doc, record(q, **fields), NOW)
    mq = question("multi")
    doc = document.put_record(doc, {**record(mq, text="t2"), "qid": "arrow"}, NOW)


def test_answer_note_and_matched_guess_helpers() -> None:
    a = Accepted(qid="q", q_rev=1, option_id=None, text="words", choices=None, order=None, note=None)
    assert answer_note(a) is None  # a text answer's text is the pick, not a note
    assert matched_guess(None, a) is None
    assert matched_guess({"text": 3}, a) is False
    empty = Accepted(qid="q", q_rev=1, option_id=None, text=None, choices=None, order=None, note="n")
    assert matched_guess({"option": "a"}, empty) is False
    r = to_record(question(), empty, prior=None, source=SOURCE, now=NOW)
    assert (r["state"], r["note"]) == ("note_only", "n")
