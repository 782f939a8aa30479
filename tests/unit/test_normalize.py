"""The normaliser: every Element gesture -> one answer content (or a note,
a withdrawal, a refusal to read), judged by the one judge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from bridge.protocol.judge import Accepted, JudgeContext, Refused, judge
from bridge.protocol.normalize import (ANSWER_TYPE, Annotation, Candidate, Unplaced, Unreadable, VoteWithdrawal, Withdrawal,
                                       normalize)
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.model import QuestionSet
from helpers.sets import all_kinds_set

ROOM = "!room:hs"
ALICE = "@alice:hs"
CTX = JudgeContext(allowed=None, members=frozenset({ALICE}), bridge_user="@bot:hs")


def _questions() -> dict[str, RecordedQuestion]:
    qset = QuestionSet.model_validate(all_kinds_set())
    out = {}
    for q in qset.questions:
        content = build_question_event(qset, q, elicitation_id=f"elc_{q.id}", poll=True)
        out[q.id] = RecordedQuestion(event_id=f"$q_{q.id}", room_id=ROOM, set_id=qset.id, content=content)
    return out


QUESTIONS = _questions()


@dataclass
class FakeLookup:
    questions: dict[str, RecordedQuestion] = field(default_factory=lambda: dict(QUESTIONS))
    polls: dict[str, str] = field(default_factory=lambda: {f"$poll_{qid}": qid for qid in QUESTIONS})
    logged: dict[str, tuple[str, str]] = field(default_factory=dict)
    answered: set[tuple[str, str]] = field(default_factory=set)  # (qid, sender) whose answer stands
    files: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    sent: dict[str, str] = field(default_factory=dict)  # the bridge's messages -> question event
    senders: dict[str, str] = field(default_factory=dict)  # logged gestures -> who sent them

    def question_by_event(self, event_id: str) -> RecordedQuestion | None:
        return next((q for q in self.questions.values() if q.event_id == event_id), None)

    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None:
        return next((q for q in self.questions.values() if q.elicitation_id == elicitation_id), None)

    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None:
        qid = self.polls.get(poll_event_id)
        return self.questions[qid] if qid else None

    def answer_reference(self, event_id: str) -> str | None:
        logged = self.logged.get(event_id)
        return logged[0] if logged else None

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        return self.logged.get(event_id)

    def has_answered(self, question: RecordedQuestion, sender: str) -> bool:
        return (question.qid, sender) in self.answered

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        return self.files.get(event_id)

    def reply_target(self, event_id: str) -> tuple[str, str | None] | None:
        if event_id in self.sent:
            return self.sent[event_id], None
        logged = self.logged.get(event_id)
        return (logged[0], self.senders.get(event_id, ALICE)) if logged else None


def event(content: dict[str, Any], type_: str = "m.room.message", event_id: str = "$e") -> dict[str, Any]:
    return {"type": type_, "event_id": event_id, "room_id": ROOM, "sender": ALICE, "origin_server_ts": 1,
            "content": content}


def reply(qid: str, body: str) -> dict[str, Any]:
    """Exactly what Element sends for a reply (PROTOCOL section 3)."""
    return event({"msgtype": "m.text", "body": body, "m.mentions": {"user_ids": ["@bot:hs"]},
                  "m.relates_to": {"m.in_reply_to": {"event_id": f"$q_{qid}"}}})


def in_thread(qid: str, content: dict[str, Any]) -> dict[str, Any]:
    return event({**content, "m.relates_to": {"rel_type": "m.thread", "event_id": f"$q_{qid}", "is_falling_back": True,
                                              "m.in_reply_to": {"event_id": f"$q_{qid}"}}})


def verdict(found: Any) -> Accepted | Refused:
    assert isinstance(found, Candidate), found
    return judge(found.question, found.answer, CTX)


def accepted(found: Any) -> Accepted:
    result = verdict(found)
    assert isinstance(result, Accepted), result
    return result


# ---------------------------------------------------------------- polls


@pytest.mark.parametrize("type_, content", [
    ("org.matrix.msc3381.poll.response", {"org.matrix.msc3381.poll.response": {"answers": ["stable"]}}),
    ("m.poll.response", {"m.selections": ["stable"]}),
    ("m.poll.response", {"m.poll.response": {"answers": ["stable"]}}),
])
def test_a_vote_in_either_format_is_that_option(type_, content):
    content = {**content, "m.relates_to": {"rel_type": "m.reference", "event_id": "$poll_branch"}}
    found = normalize(event(content, type_), FakeLookup())
    result = accepted(found)
    assert (result.qid, result.option_id, result.via) == ("branch", "stable", "poll")


def test_only_the_first_selection_counts():
    content = {"org.matrix.msc3381.poll.response": {"answers": ["main", "stable"]},
               "m.relates_to": {"rel_type": "m.reference", "event_id": "$poll_branch"}}
    assert accepted(normalize(event(content, "org.matrix.msc3381.poll.response"), FakeLookup())).option_id == "main"


def test_an_empty_vote_withdraws():
    content = {"org.matrix.msc3381.poll.response": {"answers": []},
               "m.relates_to": {"rel_type": "m.reference", "event_id": "$poll_branch"}}
    found = normalize(event(content, "org.matrix.msc3381.poll.response"), FakeLookup())
    assert isinstance(found, VoteWithdrawal) and found.question.qid == "branch" and found.sender == ALICE


def test_a_vote_in_a_poll_the_bridge_did_not_post_is_ignored():
    content = {"org.matrix.msc3381.poll.response": {"answers": ["x"]},
               "m.relates_to": {"rel_type": "m.reference", "event_id": "$someone_elses_poll"}}
    assert normalize(event(content, "org.matrix.msc3381.poll.response"), FakeLookup()) is None


def test_a_vote_for_an_option_not_offered_is_refused_by_the_judge():
    content = {"org.matrix.msc3381.poll.response": {"answers": ["nightly"]},
               "m.relates_to": {"rel_type": "m.reference", "event_id": "$poll_branch"}}
    result = verdict(normalize(event(content, "org.matrix.msc3381.poll.response"), FakeLookup()))
    assert isinstance(result, Refused) and result.reason == "option_not_offered"


def test_a_vote_on_an_approval_carries_the_binding_the_message_showed():
    content = {"org.matrix.msc3381.poll.response": {"answers": ["approve"]},
               "m.relates_to": {"rel_type": "m.reference", "event_id": "$poll_approve"}}
    assert accepted(normalize(event(content, "org.matrix.msc3381.poll.response"), FakeLookup())).option_id == "approve"


# ---------------------------------------------------------------- replies


def test_the_number_is_the_position_in_the_event_options_builtins_included():
    options = [o["id"] for o in QUESTIONS["risk"].options]
    assert options == ["low", "mid", "high", "unsure", "other"]
    assert accepted(normalize(reply("risk", "3"), FakeLookup())).option_id == "high"
    assert accepted(normalize(reply("risk", "4"), FakeLookup())).option_id == "unsure"


@pytest.mark.parametrize("body, option", [
    ("stable", "stable"), ("STABLE", "stable"), ("the stable branch", "stable"), ("  The Main Branch. ", "main"),
    ("#2", "stable"), ("2.", "stable"), ("unsure", "unsure"), ("Not sure", "unsure"),
])
def test_an_id_or_label_in_any_case(body, option):
    assert accepted(normalize(reply("branch", body), FakeLookup())).option_id == option


@pytest.mark.parametrize("body, option", [("We", "upper"), ("we", "lower"), (" We. ", "upper"), ("WE", "lower")])
def test_a_quiz_label_differing_only_in_case_is_read_as_written(body, option):
    """The bundled study set offers "we" (right) and "We": a reply "We"
    was read as the first of the two, "we", and told it was right."""
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).resolve().parents[2] / "examples" / "study-basics" / "questions.json").read_text())
    qset = QuestionSet.model_validate(raw)
    question = next(q for q in qset.questions if q.id == "reply-word")
    recorded = RecordedQuestion(event_id="$q_reply-word", room_id=ROOM, set_id=qset.id,
                                content=build_question_event(qset, question, elicitation_id="elc_reply-word"))
    lookup = FakeLookup(questions={"reply-word": recorded})
    assert accepted(normalize(reply("reply-word", body), lookup)).option_id == option


@pytest.mark.parametrize("body, option", [("Stop!", "angry"), ("stop!", "angry"), ("Stop.", "calm"), ("“Stop!”", "angry")])
def test_a_quiz_label_differing_only_in_its_last_mark_is_read_as_written(body, option):
    """A quiz offering "Stop." (calm) and "Stop!" (angry): the reply "Stop!"
    was recorded as "Stop.", the loosened words of both being "stop"."""
    qset = QuestionSet.model_validate({"askwright": 1, "id": "tone", "title": "Tone", "mode": "study", "questions": [
        {"id": "sign", "kind": "choice", "title": "Tone", "question": "Which sign shouts?", "topic": "tone",
         "options": [{"id": "calm", "label": "Stop.", "correct": False, "why": "A full stop is calm."},
                     {"id": "angry", "label": "Stop!", "correct": True, "why": "The mark shouts."}]}]})
    recorded = RecordedQuestion(event_id="$q_sign", room_id=ROOM, set_id=qset.id,
                                content=build_question_event(qset, qset.questions[0], elicitation_id="elc_sign",
                                                             order=["calm", "angry"]))
    lookup = FakeLookup(questions={"sign": recorded})
    assert accepted(normalize(reply("sign", body), lookup)).option_id == option


def test_other_with_words():
    result = accepted(normalize(reply("branch", "other: a release branch of its own"), FakeLookup()))
    assert (result.option_id, result.text) == ("other", "a release branch of its own")


def test_other_without_words_is_refused_as_input_required():
    result = verdict(normalize(reply("branch", "other"), FakeLookup()))
    assert isinstance(result, Refused) and result.reason == "input_required"


def test_a_pick_with_a_remark_keeps_the_remark():
    result = accepted(normalize(reply("branch", "2: the fixes can wait"), FakeLookup()))
    assert (result.option_id, result.text) == ("stable", "the fixes can wait")


def test_a_pick_on_the_first_line_and_a_note_below():
    result = accepted(normalize(reply("branch", "1\nkeep the shaft thin"), FakeLookup()))
    assert (result.option_id, result.note) == ("main", "keep the shaft thin")


def test_compare_sides_as_shown_are_read():
    assert accepted(normalize(reply("takes", "left"), FakeLookup())).option_id == "t2"
    assert accepted(normalize(reply("takes", "Right"), FakeLookup())).option_id == "t5"


@pytest.mark.parametrize("body, choices", [("1, 2", ("linux", "mac")), ("win, LINUX", ("win", "linux")),
                                           ("1 3", ("linux", "win")), ("macOS; 3", ("mac", "win"))])
def test_multi_numbers_ids_or_labels(body, choices):
    assert accepted(normalize(reply("platforms", body), FakeLookup())).choices == choices


def test_rank_ids_in_order():
    result = accepted(normalize(reply("order", "leak, crash, typo"), FakeLookup()))
    assert result.order == ("leak", "crash", "typo")
    assert accepted(normalize(reply("order", "3 > 1 > 2"), FakeLookup())).order == ("typo", "crash", "leak")


def test_rank_incomplete_is_the_judges_refusal():
    result = verdict(normalize(reply("order", "leak, crash"), FakeLookup()))
    assert isinstance(result, Refused) and result.reason == "rank_incomplete"


def test_text_is_the_whole_reply():
    result = accepted(normalize(reply("name", "Borealis, after the lights"), FakeLookup()))
    assert result.text == "Borealis, after the lights"
    assert accepted(normalize(reply("name", "unsure"), FakeLookup())).option_id == "unsure"


def test_a_reply_fallback_quote_is_not_the_answer():
    body = "> <@bot:hs> Release name\n> What should this release be called?\n\nBorealis"
    assert accepted(normalize(reply("name", body), FakeLookup())).text == "Borealis"
    emote = "> * <@bot:hs> waves\n\nBorealis"
    assert accepted(normalize(reply("name", emote), FakeLookup())).text == "Borealis"


def test_a_quote_the_person_typed_is_part_of_their_answer():
    # Markdown's quote in Element's composer: no sender named, so no fallback.
    body = "> Aurora was already used in 2019\n\nso: Borealis"
    assert accepted(normalize(reply("name", body), FakeLookup())).text == body


@pytest.mark.parametrize("qid, body", [("branch", "I like the second one"), ("branch", "7"), ("branch", "0"),
                                       ("platforms", "1, 9"), ("order", "crash, lunch"), ("branch", "   ")])
def test_an_unreadable_reply_gets_help_and_no_answer(qid, body):
    found = normalize(reply(qid, body), FakeLookup())
    assert isinstance(found, Unreadable)
    assert found.reason == "unreadable_reply" and found.question.qid == qid
    assert "Reply with" in found.message


@pytest.mark.parametrize("poll, reactions, ways", [
    (True, True, "Reply with the number of your pick (1\u20134), react with its number, or vote in the poll;"),
    (True, False, "Reply with the number of your pick (1\u20134) or vote in the poll;"),
    (False, True, "Reply with the number of your pick (1\u20134) or react with its number;"),
    (False, False, "Reply with the number of your pick (1\u20134);"),
])
def test_the_help_after_an_unreadable_reply_offers_only_what_the_question_offered(poll, reactions, ways):
    """In an encrypted room that trusts cross-signed devices only, keycaps are
    refused and the question's message offers none; the help after "banana"
    still said "react with its number", and the keycap was then refused."""
    qset = QuestionSet.model_validate(all_kinds_set())
    branch = next(q for q in qset.questions if q.id == "branch")
    content = build_question_event(qset, branch, elicitation_id="elc_branch", poll=poll, reactions=reactions)
    recorded = RecordedQuestion(event_id="$q_branch", room_id=ROOM, set_id=qset.id, content=content)
    found = normalize(reply("branch", "banana"), FakeLookup(questions={"branch": recorded}))
    assert isinstance(found, Unreadable) and ways in found.message, found.message


def test_a_reply_to_something_else_is_not_an_answer():
    content = {"msgtype": "m.text", "body": "2", "m.relates_to": {"m.in_reply_to": {"event_id": "$chat"}}}
    found = normalize(event(content), FakeLookup())
    assert isinstance(found, Unplaced) and found.mentions == ()  # the shell answers only a reply to the bridge
    assert normalize(event({"msgtype": "m.text", "body": "2"}), FakeLookup()) is None


def test_a_reply_to_the_bridges_word_about_a_question_answers_it():
    lookup = FakeLookup(sent={"$refusal": "$q_risk"})
    content = {"msgtype": "m.text", "body": "1", "m.mentions": {"user_ids": ["@bot:hs"]},
               "m.relates_to": {"m.in_reply_to": {"event_id": "$refusal"}}}
    found = normalize(event(content), lookup)
    assert isinstance(found, Candidate) and found.question.qid == "risk"
    assert found.answer.content["option_id"] == "low" and found.answer.via == "reply"


def test_a_reply_to_ones_own_answer_changes_it_and_to_someone_elses_does_not():
    lookup = FakeLookup(logged={"$mine": ("$q_risk", "reply"), "$bobs": ("$q_risk", "reply")},
                        senders={"$bobs": "@bob:hs"})
    mine = normalize(event({"msgtype": "m.text", "body": "3",
                            "m.relates_to": {"m.in_reply_to": {"event_id": "$mine"}}}), lookup)
    assert isinstance(mine, Candidate) and mine.answer.content["option_id"] == "high"
    bobs = normalize(event({"msgtype": "m.text", "body": "3", "m.mentions": {"user_ids": ["@bob:hs"]},
                            "m.relates_to": {"m.in_reply_to": {"event_id": "$bobs"}}}), lookup)
    assert isinstance(bobs, Unplaced) and bobs.mentions == ("@bob:hs",)
    # The bridge knows the question: its word says the reply is to Bob's answer, not why it can't place it.
    assert bobs.about == ("Risk", "@bob:hs")
    from bridge.protocol.withdrawn import unplaced_message
    assert unplaced_message(bobs.about).startswith("This replies to @bob:hs's answer to “Risk”, so it is not taken "
                                                   "as yours.")


def test_a_number_past_the_last_option_is_named():
    found = normalize(reply("platforms", "1, 9"), FakeLookup())
    assert isinstance(found, Unreadable)
    assert found.message.startswith("There is no option 9 in “Platforms”; the options are 1–")
    key = normalize(event({"m.relates_to": {"rel_type": "m.annotation", "event_id": "$q_ship", "key": "\U0001f51f"}},
                          "m.reaction"), FakeLookup())
    assert isinstance(key, Unreadable) and key.message.startswith("There is no option 10 in")


# ---------------------------------------------------------------- threads, notes, files


def test_a_pick_in_the_thread_is_an_answer():
    found = normalize(in_thread("branch", {"msgtype": "m.text", "body": "2"}), FakeLookup())
    assert accepted(found).option_id == "stable"


def test_words_in_the_thread_are_a_note_with_timecodes():
    found = normalize(in_thread("takes", {"msgtype": "m.text", "body": "keep the shaft thin\n1.4 s: the arrow jumps"}),
                      FakeLookup())
    assert isinstance(found, Annotation)
    assert found.note == "keep the shaft thin"
    assert found.timecodes == ({"t": 1.4, "text": "the arrow jumps"},)


@pytest.mark.parametrize("body, t", [("1:02 the cut is abrupt", 62.0), ("2:30: the logo flickers", 150.0),
                                     ("0:01:05 too dark", 65.0)])
def test_a_clock_time_in_the_thread_is_a_timecode_not_the_option_of_its_minutes(body, t):
    """"1:02 ..." read as option 1 with the words "02 ...": someone's remark on
    a clip replaced the answer another person gave."""
    found = normalize(in_thread("takes", {"msgtype": "m.text", "body": body}), FakeLookup())
    assert isinstance(found, Annotation), found
    assert [code["t"] for code in found.timecodes] == [t]


def test_a_pick_with_a_remark_after_a_colon_is_still_the_pick():
    found = normalize(in_thread("branch", {"msgtype": "m.text", "body": "2: the safer one"}), FakeLookup())
    assert accepted(found).option_id == "stable"


def test_words_in_the_thread_of_a_text_question_one_answered_are_a_note_and_anothers_first_words_an_answer():
    body = {"msgtype": "m.text", "body": "also fine with Aurora"}
    assert isinstance(normalize(in_thread("name", body), FakeLookup()), Candidate)
    assert isinstance(normalize(in_thread("name", body), FakeLookup(answered={("name", ALICE)})), Annotation)
    # Bob answered, not Alice: her first words in the thread are her answer, not a note on his.
    assert isinstance(normalize(in_thread("name", body), FakeLookup(answered={("name", "@bob:hs")})), Candidate)


def test_a_picture_in_the_thread_is_the_saved_file():
    content = {"msgtype": "m.image", "body": "shot.png", "url": "mxc://hs/abc", "info": {"mimetype": "image/png"}}
    lookup = FakeLookup(files={"$e": ("attachments/takes-1.png", None)})
    found = normalize(in_thread("takes", content), lookup)
    assert isinstance(found, Annotation)
    assert found.attachments == ("attachments/takes-1.png",) and found.problem is None


def test_a_picture_with_a_caption_keeps_the_caption_as_note():
    content = {"msgtype": "m.image", "body": "0:02 the logo", "filename": "shot.png", "url": "mxc://hs/abc"}
    found = normalize(in_thread("takes", content), FakeLookup(files={"$e": ("attachments/takes-1.png", None)}))
    assert found.timecodes == ({"t": 2.0, "text": "the logo"},)


def test_a_picture_that_could_not_be_kept_says_why():
    content = {"msgtype": "m.file", "body": "huge.bin", "url": "mxc://hs/abc"}
    found = normalize(in_thread("takes", content), FakeLookup(files={"$e": (None, "attachment_too_large")}))
    assert isinstance(found, Annotation) and found.problem == "attachment_too_large"
    found = normalize(in_thread("takes", content), FakeLookup())
    assert found.problem == "attachment_not_fetched"


# ---------------------------------------------------------------- reactions


def reaction(target: str, key: str) -> dict[str, Any]:
    return event({"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}}, "m.reaction")


@pytest.mark.parametrize("key, option", [("1\ufe0f\u20e3", "low"), ("2\u20e3", "mid"), ("3\ufe0f\u20e3", "high"),
                                         ("4\ufe0f\u20e3", "unsure")])
def test_a_keycap_picks_that_option(key, option):
    found = normalize(reaction("$q_risk", key), FakeLookup())
    result = accepted(found)
    assert (result.option_id, result.via) == (option, "reaction")


def test_ten_is_its_own_emoji():
    from bridge.protocol.replies import keycap_number
    assert keycap_number("\U0001f51f") == 10


def test_other_reactions_are_not_answers():
    assert normalize(reaction("$q_risk", "\U0001f44d"), FakeLookup()) is None
    assert normalize(reaction("$chat", "1\ufe0f\u20e3"), FakeLookup()) is None


def test_a_keycap_past_the_options_or_on_a_multi_gets_help():
    assert isinstance(normalize(reaction("$q_risk", "\U0001f51f"), FakeLookup()), Unreadable)
    assert isinstance(normalize(reaction("$q_platforms", "1\ufe0f\u20e3"), FakeLookup()), Unreadable)


def test_a_keycap_on_a_text_question_picks_nothing_and_says_to_reply():
    """A text question's message numbers nothing; 1\ufe0f\u20e3 there picked its
    hidden built-in ("not sure"), replacing the words someone else gave."""
    found = normalize(reaction("$q_name", "1\ufe0f\u20e3"), FakeLookup())
    assert isinstance(found, Unreadable) and found.reason == "unreadable_reaction"


# ---------------------------------------------------------------- edits and redactions


def edit(original: str, new_body: str, new: dict[str, Any] | None = None) -> dict[str, Any]:
    return event({"msgtype": "m.text", "body": f" * {new_body}",
                  "m.new_content": new or {"msgtype": "m.text", "body": new_body},
                  "m.relates_to": {"rel_type": "m.replace", "event_id": original}}, event_id="$edit")


def test_an_edit_of_a_reply_is_a_new_answer_that_replaces_it():
    lookup = FakeLookup(logged={"$r": ("$q_branch", "reply")})
    found = normalize(edit("$r", "2"), lookup)
    assert isinstance(found, Candidate) and found.replaces == "$r"
    result = accepted(found)
    assert (result.option_id, result.via, result.event_id) == ("stable", "edit", "$edit")


def test_an_edit_of_an_answer_event_inherits_its_reference():
    q = QUESTIONS["branch"]
    new = {"msgtype": "m.text", "body": "main", "suite_event_type": ANSWER_TYPE, "elicitation_id": q.elicitation_id,
           "option_id": "main"}
    found = normalize(edit("$a", "main", new), FakeLookup(logged={"$a": (q.event_id, "answer_event")}))
    assert accepted(found).option_id == "main" and found.replaces == "$a"


def test_an_edit_cannot_move_an_answer_to_another_question_by_a_reference_in_its_new_content():
    """An edit of an answer to one question whose m.new_content named another
    (its own m.relates_to and elicitation id) replaced someone else's answer
    to that other question.  The spec ignores m.relates_to in m.new_content."""
    branch, risk = QUESTIONS["branch"], QUESTIONS["risk"]
    new = {"msgtype": "m.text", "body": "low", "suite_event_type": ANSWER_TYPE, "elicitation_id": risk.elicitation_id,
           "option_id": "low", "m.relates_to": {"rel_type": "m.reference", "event_id": risk.event_id}}
    found = normalize(edit("$a", "low", new), FakeLookup(logged={"$a": (branch.event_id, "answer_event")}))
    refused = verdict(found)
    assert isinstance(refused, Refused) and refused.reason == "wrong_reference", refused


def test_an_edit_of_a_note_replaces_the_note():
    found = normalize(edit("$n", "the arrow jumps twice"), FakeLookup(logged={"$n": ("$q_takes", "note")}))
    assert isinstance(found, Annotation) and found.replaces == "$n" and found.note == "the arrow jumps twice"


def test_an_unreadable_edit_of_a_reply_gets_help():
    found = normalize(edit("$r", "hmm"), FakeLookup(logged={"$r": ("$q_branch", "reply")}))
    assert isinstance(found, Unreadable)


def test_an_edit_of_something_unknown_is_ignored():
    assert normalize(edit("$chat", "2"), FakeLookup()) is None


@pytest.mark.parametrize("where", ["event", "content"])
def test_a_redaction_withdraws_its_target(where):
    ev = event({}, "m.room.redaction", event_id="$red")
    if where == "event":
        ev["redacts"] = "$r"
    else:
        ev["content"] = {"redacts": "$r"}
    found = normalize(ev, FakeLookup())
    assert isinstance(found, Withdrawal) and found.target == "$r"


def test_the_answer_event_path_is_unchanged():
    q = QUESTIONS["branch"]
    content = {"msgtype": "m.text", "body": "main", "suite_event_type": ANSWER_TYPE, "schema_version": 1,
               "elicitation_id": q.elicitation_id, "option_id": "main",
               "m.relates_to": {"rel_type": "m.reference", "event_id": q.event_id}}
    assert accepted(normalize(event(content), FakeLookup())).via == "answer_event"


def test_a_thread_on_the_bridges_word_reads_as_a_reply_and_a_file_there_is_told_where_files_go():
    lookup = FakeLookup(sent={"$ack": "$q_branch"})
    thread = {"rel_type": "m.thread", "event_id": "$ack", "is_falling_back": True, "m.in_reply_to": {"event_id": "$ack"}}
    words = normalize(event({"msgtype": "m.text", "body": "keep it simple", "m.relates_to": thread}), lookup)
    assert isinstance(words, Unreadable) and words.question.qid == "branch"  # help, not a silent note
    pick = normalize(event({"msgtype": "m.text", "body": "2", "m.relates_to": thread}), lookup)
    assert isinstance(pick, Candidate) and pick.answer.content["option_id"] == "stable"
    picture = normalize(event({"msgtype": "m.image", "body": "a.png", "url": "mxc://hs/a", "m.relates_to": thread}),
                        lookup)
    # Files are fetched only for the question itself: this one is refused, with where to send it.
    assert isinstance(picture, Annotation) and picture.problem == "attachment_misplaced" and not picture.attachments


def test_a_bots_notice_replying_to_the_bridge_is_not_answered():
    content = {"msgtype": "m.notice", "body": "ack", "m.mentions": {"user_ids": ["@bot:hs"]},
               "m.relates_to": {"m.in_reply_to": {"event_id": "$chat"}}}
    assert normalize(event(content), FakeLookup()) is None


def test_a_batch_s_posting_keys_are_every_elicitation_and_every_event_related_to():
    from bridge.protocol.normalize import posting_keys

    events = [
        {"content": {"elicitation_id": "elc_1", "m.relates_to": {"rel_type": "m.reference", "event_id": "$q1"}}},
        {"content": {"m.new_content": {"elicitation_id": "elc_2"},
                     "m.relates_to": {"rel_type": "m.replace", "event_id": "$answer"}}},
        {"content": {"body": "> quoted", "m.relates_to": {"m.in_reply_to": {"event_id": "$q3"}}}},
        {"content": {"m.relates_to": {"rel_type": "m.reference", "event_id": "$poll"}}},
        {"content": "not an object"}, {"content": {"elicitation_id": 7, "m.relates_to": ["no"]}}, {},
    ]
    assert posting_keys(events) == ({"elc_1", "elc_2"}, {"$q1", "$answer", "$q3", "$poll"})
