"""Every acknowledgement and refusal the bridge can send, rendered: none names
an option by its id (the person never saw one) unless the id is also what the
message showed for it.

The set's option ids are made unmistakable (``opt_main``, ...) so a leak can
be told from an ordinary word; the built-ins (``unsure``, ``other``) are words
the question's message itself asks people to type, so for them only the form
that names a pick by its id (``(other)``, ``“other”`` alone) counts as a leak.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from pathlib import Path
from typing import Any

import pytest

from bridge.protocol import judge as judge_module
from bridge.protocol.judge import REASONS, Accepted, IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.normalize import Unreadable, normalize
from bridge.protocol.outcome import OTHER, OWN, annotated_notice, display_names, recorded_notice, refused_notice
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.study import Score, score_text
from bridge.protocol.to_record import to_record
from bridge.protocol.withdrawn import UNPLACED_MESSAGE, withdrawn_notice
from bridge.questionset.builtin import BUILTIN_IDS
from bridge.questionset.model import QuestionSet
from bridge.service.encryption import receiving
from bridge.protocol.file_problems import file_problem
from helpers.sets import SUBJECT, all_kinds_set

ROOM = "!room:hs"
ALICE = "@alice:hs"
BOT = "@bot:hs"
CTX = JudgeContext(allowed=None, members=frozenset({ALICE}), bridge_user=BOT)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reason-codes.md"


def _distinct_ids(data: dict[str, Any]) -> dict[str, Any]:
    """``all_kinds_set`` with every set option id made unmistakable."""
    def new(oid: str) -> str:
        return oid if oid in BUILTIN_IDS else f"opt_{oid}"
    for q in data["questions"]:
        for option in q.get("options", []):
            option["id"] = new(option["id"])
        guess = q.get("guess", {})
        for key in ("option",):
            if key in guess:
                guess[key] = new(guess[key])
        for key in ("options", "order"):
            if key in guess:
                guess[key] = [new(o) for o in guess[key]]
        if "sides" in q:
            q["sides"] = {k: (new(v) if isinstance(v, str) else v) for k, v in q["sides"].items()}
    return data


def _questions() -> dict[str, RecordedQuestion]:
    qset = QuestionSet.model_validate(_distinct_ids(all_kinds_set()))
    out = {}
    for q in qset.questions:
        content = build_question_event(qset, q, elicitation_id=f"elc_{q.id}", poll=True,
                                       text_max=40 if q.kind == "text" else 16000)
        out[q.id] = RecordedQuestion(event_id=f"$q_{q.id}", room_id=ROOM, set_id=qset.id, content=content)
    return out


QUESTIONS = _questions()


def content_for(q: RecordedQuestion, **fields: Any) -> dict[str, Any]:
    answer = {"msgtype": "m.text", "body": "answer", "schema_version": 1,
              "suite_event_type": "dev.superpipeline.question.answer.v2", "elicitation_id": q.elicitation_id,
              "m.relates_to": {"rel_type": "m.reference", "event_id": q.event_id}}
    if q.subject_bound:
        answer["subject"] = dict(SUBJECT)
    answer.update(fields)
    return {k: v for k, v in answer.items() if v is not None}


def verdict(q: RecordedQuestion | None, content: Any, *, sender: str = ALICE, room: str = ROOM) -> Accepted | Refused:
    return judge(q, IncomingAnswer("$a", room, sender, 1, content, via="reply"), CTX)


def _refusals() -> list[tuple[RecordedQuestion | None, Refused]]:
    """Answers that draw every refusal the judge has, on every kind they can happen on."""
    found: list[tuple[RecordedQuestion | None, Refused]] = []
    for q in QUESTIONS.values():
        ids = [o["id"] for o in q.options if o["id"] not in BUILTIN_IDS]
        tries: list[tuple[Any, dict[str, Any]]] = [
            (42, {}), (content_for(q, body=None), {}), (content_for(q, body=3), {}),
            (content_for(q, msgtype="m.notice"), {}), (content_for(q, option_id=""), {}),
            (content_for(q, elicitation_id="x" * 201), {}), (content_for(q, option_id=None, text=" "), {}),
            (content_for(q, option_id=ids[0] if ids else "unsure"), {"sender": BOT}),
            (content_for(q, option_id="zzz"), {}),
            (content_for(q, option_id="unsure"), {"room": "!elsewhere:hs"}),
            (content_for(q, option_id="unsure"), {"sender": "@mallory:hs"}),
            (content_for(q, option_id="unsure", elicitation_id="elc_old"), {}),
            (content_for(q, option_id="unsure", **{"m.relates_to": {"rel_type": "m.reference", "event_id": "$x"}}), {}),
            (content_for(q, option_id="other"), {}),
            (content_for(q, option_id="other", text="t" * 10500, note="n" * 10000), {}),
            (content_for(q, text="my own words, far longer than forty characters in all"), {}),
        ]
        if q.subject_bound:
            tries += [(content_for(q, option_id=ids[0], subject=None), {}),
                      (content_for(q, option_id=ids[0], subject={"id": "other-item", "digest": SUBJECT["digest"]}), {}),
                      (content_for(q, option_id=ids[0], subject={"id": SUBJECT["id"], "digest": "f" * 64}), {})]
        else:
            tries.append((content_for(q, option_id="unsure", subject=dict(SUBJECT)), {}))
        if q.kind in ("multi", "rank"):
            tries += [(content_for(q, option_id=ids[0]), {}), (content_for(q, text=f"{ids[0]}, unsure"), {}),
                      (content_for(q, text=f"{ids[0]}, {ids[0]}"), {}), (content_for(q, text=", ,"), {}),
                      (content_for(q, text=ids[1]), {})]
        for content, how in tries:
            result = verdict(q, content, **how)
            if isinstance(result, Refused):
                found.append((q, result))
        closed = RecordedQuestion(q.event_id, q.room_id, q.set_id, q.content, open=False)
        found.append((q, verdict(closed, content_for(q, option_id="unsure"))))
    found.append((None, verdict(None, content_for(QUESTIONS["branch"], option_id="opt_main"))))
    # Approvals (PROTOCOL 2a): someone not among the question's answerers; an answer after its deadline.
    branch = QUESTIONS["branch"]
    for extra in ({"answerers": ["@ana:hs", "@bo:hs"]}, {"expires": "1970-01-01T00:00:00Z"}):
        content = {**branch.content, "question": {**branch.question, **extra}}
        approval = RecordedQuestion(branch.event_id, branch.room_id, branch.set_id, content)
        found.append((approval, verdict(approval, content_for(branch, option_id="opt_main"))))
    found.append((None, judge_module._unjudgeable("recorded")))
    # A vote after the question's poll was ended by someone with the power to (the shell's, not the judge's).
    found.append((branch, judge_module.poll_ended_refusal("@mod:hs", 1_800_000_000_000)))
    return found


def _gesture_refusals() -> list[tuple[RecordedQuestion | None, str, str]]:
    """(question, reason, message) of what is refused before the judge, and in the shell."""
    out: list[tuple[RecordedQuestion | None, str, str]] = []
    for q in QUESTIONS.values():
        for body in ("hmm, the second-ish one?", "1, 9", "9", "0"):
            found = normalize({"type": "m.room.message", "event_id": "$r", "room_id": ROOM, "sender": ALICE,
                               "content": {"msgtype": "m.text", "body": body,
                                           "m.relates_to": {"m.in_reply_to": {"event_id": q.event_id}}}},
                              _Lookup())
            if isinstance(found, Unreadable):
                out.append((q, found.reason, found.message))
        found = normalize({"type": "m.reaction", "event_id": "$k", "room_id": ROOM, "sender": ALICE,
                           "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": q.event_id,
                                                        "key": "\U0001f51f"}}}, _Lookup())
        if isinstance(found, Unreadable):
            out.append((q, found.reason, found.message))
    shell = [("empty_note", "There was nothing in this message to keep."),
             ("note_too_long", "Your notes on this question would pass 20,000 characters."),
             ("too_many_timecodes", "An answer holds at most 50 timecodes."),
             ("internal_error", "the bridge could not process this message. Please try answering again."),
             ("unstorable", "the answer holds a number that is not finite, which can't be recorded."),
             ("unplaced_reply", UNPLACED_MESSAGE),
             ("undecryptable", receiving.UNDECRYPTABLE_MESSAGE), ("device_not_verified", receiving.UNVERIFIED_MESSAGE)]
    shell += [(reason, file_problem(reason, name, 12 * 1024 * 1024))
              for reason in ("attachment_too_large", "too_many_attachments", "attachment_encrypted",
                             "attachment_not_fetched", "attachment_unreachable", "attachment_rate_limited",
                             "attachment_download_failed",
                             "attachment_not_saved",
                             "attachment_misplaced")
              for name in ("release-screenshot.png", None)]
    out += [(None, reason, message) for reason, message in shell]
    return out


class _Lookup:
    def question_by_event(self, event_id: str) -> RecordedQuestion | None:
        return next((q for q in QUESTIONS.values() if q.event_id == event_id), None)

    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None:
        return None

    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None:
        return None

    def answer_reference(self, event_id: str) -> str | None:
        return None

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        return None

    def has_answered(self, question: RecordedQuestion, sender: str) -> bool:
        return False

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        return None

    def reply_target(self, event_id: str) -> tuple[str, str | None] | None:
        return None


def _accepted_records(q: RecordedQuestion) -> list[dict[str, Any]]:
    ids = [o["id"] for o in q.options if o["id"] not in BUILTIN_IDS]
    contents = [content_for(q, option_id="unsure"), content_for(q, option_id="other", text="a third way")]
    if q.kind == "multi":
        contents.append(content_for(q, text=", ".join(ids)))
    elif q.kind == "rank":
        contents.append(content_for(q, text=", ".join(reversed(ids))))
    elif q.kind == "text":
        contents = [content_for(q, option_id="unsure"), content_for(q, text="Borealis."), content_for(q, text="Aurora")]
    else:
        contents += [content_for(q, option_id=oid, note="keep it") for oid in ids]
    records = []
    for content in contents:
        result = verdict(q, content)
        assert isinstance(result, Accepted), (q.qid, content, result)
        records.append(to_record(q, result, prior=None, source={"via": "matrix", "how": "reply"}, now="now"))
    return records


def _every_notice() -> list[tuple[RecordedQuestion | None, dict[str, Any]]]:
    notices: list[tuple[RecordedQuestion | None, dict[str, Any]]] = []
    for q, refusal in _refusals():
        notices.append((q, refused_notice(answer_event_id="$a", question_event_id=q.event_id if q else None,
                                          qid=q.qid if q else None, layer=refusal.layer, reason=refusal.reason,
                                          message=refusal.message, via="reply")))
    for q, reason, message in _gesture_refusals():
        notices.append((q, refused_notice(answer_event_id="$a", question_event_id=q.event_id if q else None,
                                          qid=q.qid if q else None, layer="schema", reason=reason, message=message,
                                          via="reply")))
    for q in QUESTIONS.values():
        names = display_names(q)
        for record in _accepted_records(q):
            for via, rev in (("reply", 1), ("reply", 2), ("edit", 2), ("poll", 3)):
                notices.append((q, recorded_notice(
                    answer_event_id="$a", question_event_id=q.event_id, record={**record, "rev": rev},
                    title=q.question["title"], via=via, labels=names,
                    subject=q.subject if q.subject_bound else None)))
            for withdrawn_via in ("reply", "poll", "reaction", "note"):
                for now in (record, None):
                    notices.append((q, withdrawn_notice(
                        event_id="$r", withdrawn_event_id="$a", question_event_id=q.event_id, qid=q.qid,
                        title=q.question["title"], withdrawn_via=withdrawn_via, now=now, reply_to="$ack",
                        labels=names)))
        notices.append((q, annotated_notice(answer_event_id="$n", question_event_id=q.event_id,
                                            added={"note": "x", "timecodes": [{"t": 1, "text": ""}]},
                                            title=q.question["title"], qid=q.qid or "", q_rev=1, record_rev=1)))
    return notices


NOTICES = _every_notice()


def _leaks(q: RecordedQuestion | None, body: str) -> list[str]:
    questions = [q] if q is not None else list(QUESTIONS.values())
    leaks = []
    for question in questions:
        shown = {o["id"]: o.get("label") for o in question.options}
        for oid, label in shown.items():
            if isinstance(label, str) and label.casefold() == oid.casefold():
                continue
            if oid in BUILTIN_IDS:
                pattern = rf"\({oid}\)|[“\"]{oid}[”\"](?! if)"
            else:
                pattern = rf"\b{re.escape(oid)}\b"
            if re.search(pattern, body):
                leaks.append(oid)
    return leaks


def test_every_reason_code_is_rendered():
    documented = set(re.findall(r"^\| [a-z ]+ \| `([a-z_]+)`", DOCS.read_text(), re.M))
    documented |= {"attachment_download_failed", "attachment_not_fetched"}  # two codes on one row
    rendered = {n[OUTCOME]["reason"] for _q, n in NOTICES if OUTCOME in n and n[OUTCOME]["reason"]}
    # `invalid_content` is the schema layer's fallback for a rule the answer schema does not have.
    assert documented - rendered == {"invalid_content"}
    assert set(REASONS) - rendered == {"invalid_content"}


def test_every_kind_is_acknowledged_and_refused():
    kinds = {q.kind for q, n in NOTICES if q is not None and OUTCOME in n and n[OUTCOME]["outcome"] == "recorded"}
    assert kinds == {"choice", "multi", "compare", "rank", "text", "scale", "confirm"}


@pytest.mark.parametrize("index", range(len(NOTICES)), ids=lambda i: f"notice{i}")
def test_no_notice_names_an_option_by_its_id(index):
    q, content = NOTICES[index]
    assert _leaks(q, content["body"]) == [], content["body"]


@pytest.mark.parametrize("typed", ["3, 1, 9", "9"])
def test_a_rank_refusal_names_the_numbers_a_rank_answer_may_use(typed):
    # The built-ins have numbers after the set's options, but a rank answer orders only the set's own.
    order = QUESTIONS["order"]
    refused = normalize({"type": "m.room.message", "event_id": "$r", "room_id": ROOM, "sender": ALICE,
                         "content": {"msgtype": "m.text", "body": typed,
                                     "m.relates_to": {"m.in_reply_to": {"event_id": order.event_id}}}}, _Lookup())
    assert refused.message.startswith("There is no option 9 in \u201cFix order\u201d; the options are 1\u20133. Reply with all 3 numbers")


def test_the_examples_of_the_issue_read_in_the_persons_terms():
    order, platforms, takes = QUESTIONS["order"], QUESTIONS["platforms"], QUESTIONS["takes"]
    missing = verdict(order, content_for(order, text="opt_leak"))
    assert missing.message == ("Put every option in your order. Missing: 1 (“The crash on start”), "
                               "3 (“The typo in help”).")
    past = normalize({"type": "m.room.message", "event_id": "$r", "room_id": ROOM, "sender": ALICE,
                      "content": {"msgtype": "m.text", "body": "1, 9",
                                  "m.relates_to": {"m.in_reply_to": {"event_id": platforms.event_id}}}}, _Lookup())
    # The built-ins (4, 5) stand alone, never in a list: named as for rank.
    assert past.message.startswith("There is no option 9 in “Platforms”; the options are 1–3. Reply with the numbers")
    right = verdict(takes, content_for(takes, option_id="opt_t5"))
    record = to_record(takes, right, prior=None, source={"how": "reply"}, now="now")
    body = recorded_notice(answer_event_id="$a", question_event_id=takes.event_id, record=record, title="Intro take",
                           via="reply", labels=display_names(takes))["body"]
    assert body == "Recorded for “Intro take”: Right."  # blind: the label behind the side is not given away
    said = {stood: recorded_notice(answer_event_id="$a", question_event_id="$q", title="Name", via="reply",
                                   record={"qid": "name", "state": "answered", "text": "Borealis.", "rev": 2},
                                   stood_before=stood)["body"] for stood in (OWN, OTHER, None)}
    assert said == {OWN: "Recorded for “Name”: “Borealis.” This replaces your earlier answer.",
                    OTHER: "Recorded for “Name”: “Borealis.” This replaces the answer someone else gave.",
                    None: "Recorded for “Name”: “Borealis.”"}  # rev 2, yet the first answer was withdrawn


def test_an_approval_names_what_was_approved():
    approve = QUESTIONS["approve"]
    record = to_record(approve, verdict(approve, content_for(approve, option_id="opt_approve")), prior=None,
                       source={"how": "reply"}, now="now")
    body = recorded_notice(answer_event_id="$a", question_event_id=approve.event_id, record=record,
                           title="Approve the deploy", via="reply", labels=display_names(approve),
                           subject=approve.subject)["body"]
    assert body == (f"Recorded for “Approve the deploy”: Approve the deploy, for {SUBJECT['id']} "
                    f"(digest {SUBJECT['digest'][:16]}…).")


def test_a_withdrawal_says_what_stands_now():
    risk = QUESTIONS["risk"]
    earlier = {"qid": "risk", "state": "answered", "choice": "opt_low", "label": "Hardly risky",
               "source": {"how": "poll"}, "rev": 2}
    standing = withdrawn_notice(event_id="$r", withdrawn_event_id="$a", question_event_id=risk.event_id, qid="risk",
                                title="Risk", withdrawn_via="reply", now=earlier, reply_to="$ack",
                                labels=display_names(risk))
    assert standing["body"] == "Your answer to “Risk” is withdrawn; your earlier vote, Hardly risky, stands again."
    assert standing["dev.superpipeline.question.withdrawn"]["record_rev"] == 2
    assert standing["m.relates_to"] == {"m.in_reply_to": {"event_id": "$ack"}}
    gone = withdrawn_notice(event_id="$r", withdrawn_event_id="$a", question_event_id=risk.event_id, qid="risk",
                            title="Risk", withdrawn_via="reaction", now=None, reply_to="$ack")
    assert gone["body"] == "Your reaction to “Risk” is withdrawn; no answer is recorded now."


def test_a_score_that_replaces_an_earlier_one_says_so_with_a_real_list():
    from bridge.protocol.study import score_html

    result = Score(2, 3, {"Storage": (1, 2), "Networking": (1, 1)}, (0, 0), 0)
    quiz = SimpleNamespace(title="Quiz")
    first, again = score_text(quiz, result), score_text(quiz, result, replaces=True)
    assert first.startswith("Score for \u201cQuiz\u201d: 2 of 3.\n- Storage: 1 of 2\n") and "replaces" not in first
    assert again.startswith("Score for \u201cQuiz\u201d: 2 of 3. This replaces the earlier score")
    html = score_html(quiz, result, replaces=True)
    assert "<ul><li>Storage: 1 of 2</li><li>Networking: 1 of 1</li></ul>" in html and "- " not in html
    assert "This replaces the earlier score" in html


def test_the_study_score_reads_plainly():
    text = score_text(SimpleNamespace(title="Quiz"), Score(1, 2, {}, (1, 1), 0))
    assert "Bonus questions: 1 of 1" in text and "apart" not in text


OUTCOME = "dev.superpipeline.question.outcome"


def test_a_word_back_on_a_question_with_a_title_of_ten_thousand_characters_fits_one_event():
    """Lint only warns of such a title; every word back quoted it whole (80 KB
    with its HTML), past the homeserver's 65,536 bytes: dropped, the person
    told nothing."""
    import json

    title = "\U0001F600" * 10_000
    for content in (
        recorded_notice(answer_event_id="$a", question_event_id="$q", title=title, via="reply",
                        record={"qid": "name", "state": "answered", "text": "Borealis", "rev": 1}),
        annotated_notice(answer_event_id="$a", question_event_id="$q", added={"note": "n"}, title=title, qid="name",
                         q_rev=1, record_rev=1),
        withdrawn_notice(event_id="$r", withdrawn_event_id="$a", question_event_id="$q", qid="name", title=title,
                         withdrawn_via="reply", now=None, reply_to="$ack"),
    ):
        assert len(json.dumps(content, ensure_ascii=False).encode()) < 8_000, content["body"][:80]
        assert "\u2026\u201d" in content["body"]


def test_a_text_answer_that_turns_the_line_around_is_quoted_without_it():
    # "\u202eabc" reversed the bridge's own closing quote and sentence for everyone in the room.
    body = recorded_notice(answer_event_id="$a", question_event_id="$q", title="Name", via="reply",
                           record={"qid": "name", "state": "answered", "text": "\u202eabc\u200b", "rev": 1})["body"]
    assert body == "Recorded for \u201cName\u201d: \u201cabc\u201d."


def _quiz(gate_right: str = "blue", **gate_extra: Any) -> QuestionSet:
    def choice(qid: str, right: str, **extra: Any) -> dict[str, Any]:
        return {"id": qid, "kind": "choice", "title": qid.title(), "question": f"{qid}?", **extra,
                "options": [{"id": "green", "label": "Green", **({"correct": True} if right == "green" else {})},
                            {"id": "blue", "label": "Blue", **({"correct": True} if right == "blue" else {})}]}
    return QuestionSet.model_validate({"askwright": 1, "id": "quiz", "title": "Quiz", "mode": "study", "questions": [
        choice("gate", gate_right, **gate_extra), choice("follow", "green", show_if={"question": "gate", "option": ["blue"]})]})


def test_a_quiz_whose_only_if_question_is_not_asked_is_complete_without_it():
    """"Follow" is only needed if the gate's answer is Blue: answered Green,
    the quiz was never scored (complete waited for "follow")."""
    from bridge.protocol.study import complete, score

    quiz = _quiz()
    green = {"gate": {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 1}}
    assert complete(quiz, green)
    assert (score(quiz, green).points, score(quiz, green).possible) == (0.0, 1.0)
    blue = {"gate": {"qid": "gate", "state": "answered", "choice": "blue", "q_rev": 1}}
    assert not complete(quiz, blue)  # now "follow" is asked


def test_an_answer_to_a_revision_since_replaced_is_not_scored_against_the_new_one():
    """Green, told "Not quite" at rev 1; rev 2 made Green right, and the
    quiz scored the rev-1 answer right against it."""
    from bridge.protocol.study import complete, score

    quiz = _quiz(gate_right="green", rev=2)
    stale = {"gate": {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 1}}
    assert not complete(quiz, stale) and score(quiz, stale).points == 0.0
    fresh = {"gate": {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 2}}
    assert complete(quiz, fresh) and score(quiz, fresh).points == 1.0


def test_the_verdict_on_an_answer_to_a_replaced_revision_is_not_the_new_ones():
    """Rev 2 made Blue right; a pick of Green on the rev-1 message (right when
    asked), acknowledged late, was told "Not quite ... The answer is Blue"."""
    from bridge.protocol.study import feedback

    gate = _quiz(gate_right="blue", rev=2).question("gate")
    assert feedback(gate, {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 1}) is None
    assert feedback(gate, {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 2}).startswith("Not quite")


def test_what_a_score_is_made_of_leaves_out_answers_to_questions_not_asked():
    """Gate answered Green ("follow" not asked), then "follow" answered
    anyway: the score (1 of 1) was posted again as replacing the first."""
    from bridge.protocol.study import counted

    quiz = _quiz(gate_right="green")
    gate = {"qid": "gate", "state": "answered", "choice": "green", "q_rev": 1}
    follow = {"qid": "follow", "state": "answered", "choice": "blue", "q_rev": 1}
    assert counted(quiz, {"gate": gate}) == counted(quiz, {"gate": gate, "follow": follow}) == {"gate": gate}
    asked = {"qid": "gate", "state": "answered", "choice": "blue", "q_rev": 1}
    assert counted(quiz, {"gate": asked, "follow": follow}) == {"gate": asked, "follow": follow}


def test_one_written_answer_waits_for_grading():
    assert "1 written answer waits for grading." in score_text(SimpleNamespace(title="Quiz"), Score(1, 2, {}, (0, 0), 1))
    assert "2 written answers wait for grading." in score_text(SimpleNamespace(title="Quiz"), Score(1, 2, {}, (0, 0), 2))


def test_a_refusal_naming_options_of_long_labels_stays_small_enough_to_send():
    """A rank of five 7,000-character labels (lint only warns): "Missing: …"
    quoted each whole, past the homeserver's 65,536 bytes in body and HTML
    together, and the person was told nothing."""
    rank = next(q for q in QUESTIONS.values() if q.kind == "rank")
    options = [{**o, "label": f"{n} " + "long words " * 700} if o["id"] not in BUILTIN_IDS else o
               for n, o in enumerate(rank.question["options"])]
    long = RecordedQuestion(rank.event_id, rank.room_id, rank.set_id,
                            {**rank.content, "question": {**rank.question, "options": options}})
    first = next(o["id"] for o in options if o["id"] not in BUILTIN_IDS)
    refused = verdict(long, content_for(long, text=first))
    assert isinstance(refused, Refused) and refused.reason == "rank_incomplete"
    assert "Missing: 2 (\u201c1 long words" in refused.message and len(refused.message) < 2_000
    assert len(verdict(long, content_for(long, text="x" * 60_000)).message) < 2_000
