"""The question's poll names what an approval approves."""

from __future__ import annotations

from bridge.protocol.poll import POLL_START, TEXT, poll_start
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.model import QuestionSet

DIGEST = "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"


def recorded(**fields: object) -> RecordedQuestion:
    q = {"id": "publish", "kind": "confirm", "title": "Publish the RC", "question": "Publish release candidate 2.4.0-rc1?",
         "why": "x", "options": [{"id": "go", "label": "Publish it"}, {"id": "wait", "label": "Wait"}],
         "guess": {"option": "go", "why": "x", "confidence": "high"}, **fields}
    qset = QuestionSet.model_validate({"askwright": 1, "id": "rel", "title": "Release", "questions": [q]})
    content = build_question_event(qset, qset.questions[0], elicitation_id="elc_p", poll=True)
    return RecordedQuestion(event_id="$q", room_id="!r:hs", set_id="rel", content=content)


def test_an_approval_poll_names_the_subject_and_short_digest() -> None:
    poll = poll_start(recorded(subject={"id": "release-2.4.0-rc1", "digest": DIGEST}))
    assert poll is not None
    asked = poll[POLL_START]["question"][TEXT]
    assert asked == ("Publish the RC: Publish release candidate 2.4.0-rc1? \u2014 approving release-2.4.0-rc1 "
                     "(digest 0588c96c7eff47e1\u2026)")
    assert poll["body"].startswith(asked)


def test_a_long_question_is_cut_but_the_subject_never() -> None:
    poll = poll_start(recorded(question="Publish " + "very " * 400 + "now?", subject={"id": "rc1", "digest": DIGEST}))
    assert poll is not None
    asked = poll[POLL_START]["question"][TEXT]
    assert len(asked) <= 1000 and asked.endswith("\u2014 approving rc1 (digest 0588c96c7eff47e1\u2026)")


def test_a_poll_without_subject_is_unchanged() -> None:
    poll = poll_start(recorded())
    assert poll is not None
    assert poll[POLL_START]["question"][TEXT] == "Publish the RC: Publish release candidate 2.4.0-rc1?"


def test_the_poll_offers_no_option_a_vote_alone_cannot_answer() -> None:
    """"Something else" needs the person's words and a vote carries none: in
    the poll it could only be refused, so it is left to the reply the
    message names, and the message still says to vote for the rest."""
    question = recorded()
    poll = poll_start(question)
    assert poll is not None
    assert [a["id"] for a in poll[POLL_START]["answers"]] == ["go", "wait", "unsure"]
    assert "Something else" not in poll["body"]
    body = question.content["body"]
    assert "vote in the poll" in body and "other: <your text>" in body

