"""An agent's words inside the bridge's own sentences: never past Matrix's
event limit, and never turning the bridge's words after them around."""

from __future__ import annotations

from typing import Any

from bridge.protocol.outcome import recorded_notice
from bridge.protocol.poll import poll_end, poll_start
from bridge.protocol.question_event import build_question_event, closed_replacement, content_size, new_elicitation_id
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.study import Score, score_text
from bridge.questionset.model import QuestionSet
from bridge.service.posting.poster import _closing_words

RLO = "\u202e"
LIMIT = 65536
DIGEST = "sha256:" + "ab" * 32


def question(**fields: Any) -> dict[str, Any]:
    return {"id": "q1", "kind": "choice", "title": "The database", "question": "Which database should we use?",
            "why": "The schema work starts tomorrow.",
            "options": [{"id": "pg", "label": "Run PostgreSQL"}, {"id": "sq", "label": "Run SQLite"}],
            "guess": {"option": "pg", "why": "It is used elsewhere.", "confidence": "high"}, **fields}


def posted(raw: dict[str, Any]) -> tuple[QuestionSet, dict[str, Any]]:
    qset = QuestionSet.model_validate({"askwright": 1, "id": "demo", "title": "Demo", "questions": [raw]})
    asked = qset.questions[0]
    return qset, build_question_event(qset, asked, elicitation_id=new_elicitation_id("demo", asked.id, asked.rev, "t"))


def test_a_long_withdrawal_reason_still_closes_the_question_in_the_room():
    """A reason of 30,000 characters made the closing edit 121 KB: refused by
    the homeserver, so the room never learnt the question closed, and its
    poll end, sent after it, never went out."""
    qset, content = posted(question(status="withdrawn", reason="x" * 30_000))
    why = _closing_words(qset.questions[0], qset)
    assert len(why) < 600
    assert content_size(closed_replacement("$q", content, why, None)) < LIMIT
    assert content_size(poll_end("$poll", why)) < LIMIT


def test_a_long_label_still_gets_its_word_back():
    """A label of 12,000 characters (each & an &amp; in HTML) made the word
    back 72 KB, refused for good and dropped: the voter was told nothing."""
    label = "Keep " + "&" * 12_000
    notice = recorded_notice(answer_event_id="$a", question_event_id="$q",
                             record={"qid": "q1", "choice": "pg", "label": label, "rev": 1, "state": "answered"},
                             title="The database", via="reply", numbers={"pg": 1}, labels={"pg": label})
    assert content_size(notice) < LIMIT
    assert "Keep &&&" in notice["body"]


def test_a_direction_override_in_an_agents_words_never_turns_the_bridges_around():
    """U+202E in a subject id showed the digest people check by eye reversed
    (the message, the poll, the word back); in a reason, the close notice's
    last words; in the set's title, the quiz score."""
    raw = question(subject={"id": f"release-2.4{RLO}", "digest": DIGEST},
                   options=[{"id": "ok", "label": "Approve the deploy"}, {"id": "no", "label": "Hold the deploy"}],
                   guess={"option": "ok", "why": "Tests pass.", "confidence": "high"})
    qset, content = posted(raw)
    shown = [line for line in content["body"].splitlines() if line.startswith("Approving")]
    assert shown and RLO not in shown[0] and RLO not in content["formatted_body"]
    recorded = RecordedQuestion(event_id="$q", room_id="!r:hs", set_id="demo", content=content)
    assert RLO not in poll_start(recorded)["org.matrix.msc3381.poll.start"]["question"]["body"]
    notice = recorded_notice(answer_event_id="$a", question_event_id="$q",
                             record={"qid": "q1", "choice": "ok", "label": "Approve the deploy", "rev": 1,
                                     "state": "answered"},
                             title="The database", via="reply", subject=(f"release-2.4{RLO}", DIGEST), numbers={"ok": 1})
    assert RLO not in notice["body"] and "release-2.4 (digest" in notice["body"]
    withdrawn, _ = posted(question(status="withdrawn", reason=f"{RLO}decided in the meeting"))
    assert RLO not in _closing_words(withdrawn.questions[0], withdrawn)
    quiz = QuestionSet.model_validate({"askwright": 1, "id": "demo", "title": f"Demo{RLO}", "questions": [question()]})
    assert RLO not in score_text(quiz, Score(3, 4, {}, (0, 0), 0))


def test_a_title_in_the_escalation_and_the_edits_fallback_is_cut_and_turns_nothing_around():
    """The escalation's mention and an edit's plain fallback quoted the title
    as written: a U+202E in it reversed the bridge's words after it."""
    from bridge.service.answering.deadlines import escalation_content

    title = f"Ship it{RLO} " + "x" * 5000
    qset, content = posted(question(title=title, expires="2030-01-01T10:00:00Z",
                                    escalate={"after": "2030-01-01T09:00:00Z", "to": ["@ana:example.org"]}))
    recorded = RecordedQuestion(event_id="$q", room_id="!r", set_id="demo", content=content)
    escalation = escalation_content(recorded)["body"]
    edit = closed_replacement("$q", content, "Closed.", 1_800_000_000_000)["body"]
    for said in (escalation, edit):
        assert RLO not in said and len(said) < 600, said
    assert escalation.endswith("is still undecided; you may answer it now.")
