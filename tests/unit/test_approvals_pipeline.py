"""Approvals (PROTOCOL 2a): lint of the four fields, what the question says in
the room, the judge's refusals by the room's order, the quorum record through
the real pipeline and store, the deadlines pass, and ``wait``'s exit 4."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.answers.file import AnswersFile
from bridge.cli import main
from bridge.protocol.deadline import format_rfc3339, parse_when
from bridge.service.sections import parse_duration
from bridge.protocol.judge import Accepted, IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.lint import lint
from bridge.questionset.media import LocalFilesystem
from bridge.questionset.model import QuestionSet
from bridge.service.answering.deadlines import Deadlines
from bridge.service.answering.pipeline import Pipeline
from bridge.service.storage.store import Store
from helpers.sets import all_kinds_set
from helpers.timeline import ROOM, Room, Transport, answer, edit, redact, vote

ANA, BO, CY, DEE, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@mod:hs", "@eve:hs"
T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z
APPROVAL = {"answerers": [ANA, BO, CY], "quorum": {"required": 2, "veto": ["stable"]}}


def approval_set(**fields: Any) -> dict[str, Any]:
    raw = all_kinds_set("kinds")
    next(q for q in raw["questions"] if q["id"] == "branch").update(fields)
    return raw


def findings(raw: dict[str, Any], tmp_path: Path) -> list[tuple[str, str]]:
    result = lint(raw, LocalFilesystem(tmp_path))
    return [(f.where, f.message) for f in result.errors]


# -- lint --------------------------------------------------------------------------


def test_a_clean_approval_lints_clean(tmp_path):
    raw = approval_set(expires="2h", escalate={"after": "1h", "to": [DEE]}, **APPROVAL)
    assert [f for f in findings(raw, tmp_path) if "branch" in f[0]] == []


@pytest.mark.parametrize("fields, where, words", [
    ({"quorum": {"required": 1}}, "questions[platforms].quorum", "a multi question can't have one"),
    ({"quorum": {"required": 2, "veto": ["nope"]}}, "questions[branch].quorum.veto[0]", "not one of this question's options"),
    ({"answerers": [ANA], "quorum": {"required": 2}}, "questions[branch].quorum.required", "could never be met"),
    ({"expires": "2020-01-01T00:00:00Z"}, "questions[branch].expires", "is in the past"),
    ({"expires": "soon"}, "questions[branch].expires", "must be a duration"),
    ({"expires": "2030-01-01T00:00:00"}, "questions[branch].expires", "RFC 3339 time with a zone"),
    ({"answerers": ["alice"]}, "questions[branch].answerers[0]", "is not a Matrix user id"),
    ({"escalate": {"after": "1h", "to": ["bob@hs"]}}, "questions[branch].escalate.to[0]", "is not a Matrix user id"),
    # Lint passed these; the first was never posted (retried for ever), the
    # second called people in once nobody could answer any more.
    ({"expires": "500000w"}, "questions[branch].expires", "too far away"),
    # A misspelt veto was only a warning: the approval went out that nobody could stop.
    ({"quorum": {"required": 2, "vetoes": ["stable"]}}, "questions[branch].quorum.vetoes",
     "the bridge would ignore it, and decide otherwise than meant"),
    # Python's own words ("offset must be a timedelta strictly between ...") told nobody what to fix.
    ({"expires": "2030-01-01T10:00:00+25:00"}, "questions[branch].expires", "a zone offset past ±23:59"),
    ({"expires": "2030-02-30T10:00:00Z"}, "questions[branch].expires", "is not a time there is"),
    ({"expires": "8s", "escalate": {"after": "14s", "to": ["@dee:hs"]}}, "questions[branch].escalate.after",
     "is not before expires"),
    # A deadline in ten minutes and an escalation two hours after the posting: late whenever it is posted.
    ({"expires": format_rfc3339(int(time.time() * 1000) + 600_000), "escalate": {"after": "2h", "to": ["@dee:hs"]}},
     "questions[branch].escalate.after", "is not before expires"),
])
def test_each_bad_field_is_an_error_with_clear_words(tmp_path, fields, where, words):
    raw = all_kinds_set("kinds")
    qid = "platforms" if where.startswith("questions[platforms]") else "branch"
    next(q for q in raw["questions"] if q["id"] == qid).update(fields)
    found = [message for at, message in findings(raw, tmp_path) if at == where]
    assert found and words in found[0], findings(raw, tmp_path)


def test_a_decided_approval_is_closed_at_its_deadline_without_a_new_answer(tmp_path, capsys):
    """Decided by two votes, then its deadline passed: the record's
    ``updated`` stays the decision's, so an agent waiting for an answer newer
    than it (``after``) is not woken for nothing; and ``read`` shows the
    question ``closed`` (it said ``open`` though no vote could count)."""
    approval = {"expires": "45s", "answerers": [ANA, BO], "quorum": {"required": 2}}
    room = Room(tmp_path, approval=approval, posted_ms=T0)
    raw = all_kinds_set("kinds")
    next(q for q in raw["questions"] if q["id"] == "branch").update(approval)
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$a2", BO, T0 + 2000, "main")])

    def deadlines_at(ms: int) -> None:
        asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                              clock=lambda: ms / 1000).pass_once())

    deadlines_at(T0 + 3000)
    decided = room.record()
    assert decided["decided_by"] == [ANA, BO] and "closed_at" not in decided
    time.sleep(0.01)
    deadlines_at(T0 + 46_000)
    assert room.record() == {**decided, "closed_at": format_rfc3339(T0 + 45_000)}
    assert main(["read", str(room.set_dir)]) == 0
    entry = next(e for e in json.loads(capsys.readouterr().out)["answers"] if e["qid"] == "branch")
    assert (entry["state"], entry["status"], entry["choice"]) == ("answered", "closed", "main")
    assert room.verify() == []


def test_a_quorum_whose_every_option_is_a_veto_is_a_warning(tmp_path):
    raw = approval_set(quorum={"required": 2, "veto": ["main", "stable"]})
    options = {o["id"] for o in next(q for q in raw["questions"] if q["id"] == "branch")["options"]}
    assert options == {"main", "stable"}, options
    warned = [(f.where, f.message) for f in lint(raw, LocalFilesystem(tmp_path)).warnings]
    assert ("questions[branch].quorum.veto",
            "every option is a veto: the first vote decides, and required (2) counts for nothing") in warned


@pytest.mark.parametrize("question, required, allowed", [
    ({}, 3, 2),  # the question names nobody: the bridge's two may answer
    ({"answerers": [ANA, CY]}, 2, 1),  # Carol is not among the bridge's: only Alice may
    ({"answerers": [CY], "escalate": {"after": "1h", "to": [ANA]}}, 2, 1),
])
def test_a_quorum_the_bridges_answerers_could_never_meet_is_refused_where_the_bridge_reads_the_set(
        tmp_path, capsys, question, required, allowed):
    """The bridge's ``answerers: [alice, bob]`` and a 3-of quorum: posted
    ("Decided when 3 people pick the same option"), every vote told "1 of 3
    so far", never decided.  Lint knew only the question's own answerers."""
    import yaml

    from bridge.agents.errors import LintFailed
    from bridge.agents.sets import AgentSets
    from bridge.service.posting.sets import load_set
    from helpers.config import GOOD

    raw = approval_set(quorum={"required": required}, **question)
    assert findings(raw, tmp_path) == []  # without the bridge's config: nothing to say
    words = f"required is {required} but only {allowed} {'person' if allowed == 1 else 'people'} may answer"
    bridge = [ANA, BO]
    # The poster's reading: not posted, and why.
    set_dir = tmp_path / "ask" / "kinds"
    set_dir.mkdir(parents=True)
    (set_dir / "questions.json").write_text(json.dumps(raw))
    model, errors = load_set(set_dir, answerers=bridge)
    assert model is None and any(words in e for e in errors), errors
    assert load_set(set_dir)[0] is not None  # (the same set, anyone in the room may answer: posted)
    # lint -c with the bridge's config says it, as the agents' API refuses it.
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**GOOD, "answerers": bridge}))
    assert main(["lint", "-c", str(config), str(set_dir)]) == 1
    assert words in capsys.readouterr().out
    with pytest.raises(LintFailed) as refused:
        AgentSets(tmp_path / "other", answerers=bridge).ask("planner", "kinds", raw)
    assert any(words in f["message"] for f in refused.value.findings), refused.value.findings


@pytest.mark.parametrize("at_set_level", [False, True])
def test_a_posted_revision_whose_time_passed_leaves_the_rest_of_the_set_free_to_change(tmp_path, at_set_level):
    """A question expired at its RFC 3339 time; the agent then adds another
    question.  Lint refused the whole set ("is in the past"), so the poster
    skipped it: nothing new was ever posted.  A revision not yet posted with
    a time gone by is still refused."""
    from bridge.questionset.lint import lint as lint_with

    raw = all_kinds_set("kinds")
    branch = next(q for q in raw["questions"] if q["id"] == "branch")
    if at_set_level:
        raw["expires"] = "2020-01-01T00:00:00Z"
    else:
        branch["expires"] = "2020-01-01T00:00:00Z"
    posted = {q["id"]: 1 for q in raw["questions"]}
    raw["questions"].append({**branch, "id": "branch2", "expires": "2h", "title": "Which branch next?",
                             "question": "Which branch do we release next?"})

    def errors(revs: dict[str, int]) -> list[str]:
        return [f.where for f in lint_with(raw, LocalFilesystem(tmp_path), posted_revs=revs).errors]

    assert errors(posted) == []
    assert errors({}) == ["expires" if at_set_level else "questions[branch].expires"]
    branch["rev"] = 2  # a new revision with the old time: it would be posted already expired
    assert errors(posted) == ["expires" if at_set_level else "questions[branch].expires"]


def test_durations_take_the_reminders_units_and_rfc3339_needs_a_zone():
    assert parse_when("45s", T0) == T0 + 45_000
    assert parse_when("90m", T0) == T0 + 90 * 60_000
    assert parse_when("1w", T0) == T0 + 7 * 86_400_000
    assert parse_when("2027-01-15T10:00:00+02:00", 0) == T0
    with pytest.raises(ValueError):
        parse_when("2027-01-15T10:00:00", 0)


@pytest.mark.parametrize("written", ["\u0663h", "\uff13h", "2\u0660m", "\uff12\uff10\uff12\uff17-01-15T10:00:00Z"])
def test_a_time_written_in_digits_other_than_ascii_is_refused(written):
    # "٣h" (Arabic-Indic three) was read as three hours: no other reader of
    # the set takes it, and in a config the same reader took it too.
    with pytest.raises(ValueError):
        parse_when(written, T0)
    with pytest.raises(ValueError):
        parse_duration(written)


# -- what the room shows -------------------------------------------------------------


def posted(**fields: Any) -> dict[str, Any]:
    qset = QuestionSet.model_validate(approval_set(**fields))
    return build_question_event(qset, qset.question("branch"), elicitation_id="elc_branch", posted_ms=T0, poll=True)


def test_the_question_says_its_deadline_who_may_answer_and_the_quorum():
    content = posted(expires="2h", escalate={"after": "1h", "to": [DEE]}, **APPROVAL)
    assert content["question"]["expires"] == "2027-01-15T10:00:00Z"
    assert content["question"]["escalate"] == {"after": "2027-01-15T09:00:00Z", "to": [DEE]}
    body = content["body"]
    assert "Answer by 10:00 UTC." in body.split("\n")
    assert f"Who may answer: {ANA}, {BO}, {CY}." in body
    assert "Decided when 2 people pick the same option; \u201cThe stable branch\u201d from anyone decides at once." in body
    assert f"Undecided by 09:00 UTC: {DEE} will be asked too." in body
    assert "Answer by 10:00 UTC" in content["formatted_body"]


def posted_before(content: dict[str, Any], left: str = "2 hours") -> dict[str, Any]:
    """The message as a bridge posted it before the deadline was said as a
    time only: its line said the time left from the posting, ", in 2 hours"."""
    def said(text: str) -> str:
        return re.sub(r"(Answer by [^\n<]*UTC)\.", rf"\1, in {left}.", text)

    return dict(content, body=said(content["body"]), formatted_body=said(content["formatted_body"]))


def test_the_deadline_is_said_as_a_time_that_stays_true_never_the_time_left():
    """The message said "Answer by 08:30 UTC, in 30 minutes.", counted from
    its posting: read an hour later (the deadline passed, and before that the
    edit at the close), it still said 30 minutes were left.  It names the
    time (the event's ``question.expires`` carries it exactly), with its date
    when that is not the posting's day, and the close and an undo still find
    the line to say what became of it."""
    from bridge.protocol.question_event import closed_replacement, reopened_replacement

    soon = posted(expires="30m", **APPROVAL)
    assert soon["question"]["expires"] == "2027-01-15T08:30:00Z"
    later = posted(expires="3d", **APPROVAL)
    for content, line in ((soon, "Answer by 08:30 UTC."), (later, "Answer by Mon 18 Jan 2027, 08:00 UTC.")):
        assert line in content["body"].split("\n")
        assert f"<em>{line}</em>" in content["formatted_body"]
        for shown in (content["body"], content["formatted_body"]):
            assert not re.search(r"\bin \d+ (second|minute|hour|day|week)", shown), shown
    closed = closed_replacement("$q", soon, "expired undecided at 08:30 UTC: no votes", T0 + 30 * 60_000)
    assert "Deadline: 08:30 UTC (passed)." in _closed_lines(closed)
    assert not any(line.startswith("Answer by") for line in _closed_lines(closed))
    again = reopened_replacement("$q", soon, "undecided again", T0 + 10 * 60_000)["m.new_content"]
    assert "Answer by 08:30 UTC." in again["body"].split("\n")


def test_a_set_without_the_fields_posts_exactly_as_before():
    qset = QuestionSet.model_validate(all_kinds_set("kinds"))
    before = build_question_event(qset, qset.question("branch"), elicitation_id="elc_branch")
    assert before == build_question_event(qset, qset.question("branch"), elicitation_id="elc_branch", posted_ms=T0)
    assert not {"expires", "answerers", "quorum", "escalate"} & set(before["question"])


# -- the judge, by the room's order ----------------------------------------------------


def recorded(**fields: Any) -> RecordedQuestion:
    return RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds", content=posted(**fields))


def incoming(sender: str, ts: int, option: str = "main") -> IncomingAnswer:
    return IncomingAnswer(event_id=f"$a{ts}", room_id=ROOM, sender=sender, origin_server_ts=ts, content={
        "msgtype": "m.text", "body": option, "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": "elc_branch", "option_id": option,
        "m.relates_to": {"rel_type": "m.reference", "event_id": "$q"}})


CTX = JudgeContext(allowed=None, members=frozenset({ANA, BO, CY, DEE, EVE}), bridge_user="@bot:hs")


def test_a_stranger_is_refused_with_who_may_answer():
    verdict = judge(recorded(**APPROVAL), incoming(EVE, T0 + 1), CTX)
    assert isinstance(verdict, Refused) and verdict.reason == "not_an_answerer"
    assert f"Only {ANA}, {BO} or {CY} may answer" in verdict.message


def test_an_answer_a_second_after_the_deadline_is_late_and_one_before_counts_even_once_closed():
    question = recorded(expires="45s", **APPROVAL)
    late = judge(question, incoming(ANA, T0 + 46_000), CTX)
    assert isinstance(late, Refused) and late.reason == "expired" and "expired at 08:00:45 UTC" in late.message
    closed = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds", content=question.content, open=False,
                              closed_why="expired")
    assert isinstance(judge(closed, incoming(ANA, T0 + 44_000), CTX), Accepted)
    withdrawn = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds", content=question.content, open=False,
                                 closed_why="withdrawn")
    assert judge(withdrawn, incoming(ANA, T0 + 44_000), CTX).reason == "question_closed"
    # Decided before the deadline, it never expired: a vote after the deadline is told so, not "expired".
    decided = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds", content=question.content, open=False,
                               closed_why="decided")
    after = judge(decided, incoming(ANA, T0 + 46_000), CTX)
    assert isinstance(after, Refused) and after.reason == "expired"
    assert after.message.startswith("This question was decided before its deadline, 08:00:45 UTC"), after.message
    assert "expired" not in after.message


def test_the_escalated_may_answer_from_the_escalation_on_in_the_rooms_order():
    question = recorded(escalate={"after": "1h", "to": [DEE]}, **APPROVAL)
    early = judge(question, incoming(DEE, T0 + 3_599_000), CTX)
    assert early.reason == "not_an_answerer"
    # Told when it is theirs to answer, not only who may answer now.
    assert early.message.endswith("It is called in to you at 09:00 UTC (2027-01-15T09:00:00Z); answer "
                                  "from then on."), early.message
    assert "called in" not in judge(question, incoming("@zed:hs", T0 + 1000), CTX).message
    assert isinstance(judge(question, incoming(DEE, T0 + 3_600_000), CTX), Accepted)


# -- the record, through the real pipeline and store --------------------------------------


def room_with(tmp_path: Path, **fields: Any) -> Room:
    return Room(tmp_path, approval={**APPROVAL, **fields}, posted_ms=T0)


def test_a_voters_words_stay_with_their_vote_when_another_decides(tmp_path):
    """Ana approves "only after 5pm", Bo's vote decides: the record's note is
    Bo's (its source's), and Ana's condition was nowhere in it, the agent
    acting on an approval without it."""
    room = room_with(tmp_path)
    conditional = answer("$a1", ANA, T0 + 1000, "main")
    conditional["content"]["note"] = "only after 5pm"
    room.deliver([conditional, answer("$b1", BO, T0 + 2000, "main")])
    record = room.record()
    assert record["state"] == "answered" and record["decided_by"] == [ANA, BO]
    assert [(v["sender"], v.get("note")) for v in record["votes"]] == [(ANA, "only after 5pm"), (BO, None)]
    assert room.verify() == []


def test_votes_a_changed_vote_a_withdrawn_vote_and_the_decision(tmp_path):
    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    record = room.record()
    assert record["state"] == "pending" and record["required"] == 2 and "choice" not in record
    assert [(v["sender"], v["choice"]) for v in record["votes"]] == [(ANA, "main")]
    room.deliver([answer("$x", EVE, T0 + 1500, "main")])  # a stranger: refused, no vote
    assert [v["sender"] for v in room.record()["votes"]] == [ANA]
    # A changed vote: Alice makes hers "not sure", which is no vote.
    room.deliver([edit("$a2", ANA, T0 + 2000, "$a1", "unsure")])
    assert room.record()["state"] == "unsure" and not room.record().get("votes")
    # Bob votes in the poll and takes it back: one vote short all along.
    room.deliver([vote("$b1", BO, T0 + 3000, ["main"])])
    assert room.record()["state"] == "pending" and [v["sender"] for v in room.record()["votes"]] == [BO]
    room.deliver([vote("$b2", BO, T0 + 4000, [])])
    assert room.record().get("state") != "answered" and not room.record().get("votes")
    room.crash()  # the bridge restarted between two votes: only the store survives
    room.deliver([answer("$c1", CY, T0 + 5000, "main"), answer("$a3", ANA, T0 + 5500, "main")])
    record = room.record()
    assert record["state"] == "answered" and record["choice"] == "main" and record["decided_by"] == [CY, ANA]
    # After the decision: a redaction of a deciding vote is recorded without changing it.
    room.deliver([redact("$r1", ANA, T0 + 6000, "$a3")])
    record = room.record()
    assert record["state"] == "answered" and record["decided_by"] == [CY, ANA]
    assert [v["sender"] for v in record["votes"]] == [CY]


def test_something_else_is_no_vote_and_decides_nothing(tmp_path):
    """PROTOCOL 2a: other is not a vote.  One person's "other: next week" on
    a 2-of-3 approval read as answered (wait returned, the word back said
    "Decided: … by ."), until a real vote made it pending again."""
    room = room_with(tmp_path)
    other = answer("$o1", ANA, T0 + 1000, "other")
    other["content"]["text"] = "next week"
    room.deliver([other])
    record = room.record()
    assert record["state"] == "pending" and record["votes"] == [] and record["required"] == 2
    assert "choice" not in record and "decided_by" not in record
    (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$o1'").fetchone()
    told = room.pipeline.notice_for(room.store.log_entry(seq))["body"]
    assert "Decided" not in told and told.endswith("No votes stand yet; 2 must agree.")
    room.deliver([answer("$b1", BO, T0 + 2000, "main")])
    assert room.record()["state"] == "pending" and [v["sender"] for v in room.record()["votes"]] == [BO]


def test_a_veto_decides_at_once_and_a_late_delivered_earlier_vote_keeps_the_rooms_order(tmp_path):
    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 3000, "stable")])
    record = room.record()
    assert record["state"] == "answered" and record["choice"] == "stable" and record["decided_by"] == [BO]
    # Carol's vote was sent before Bob's veto but reaches the bridge after it: she and Alice decided first.
    room.deliver([answer("$c1", CY, T0 + 2000, "main")])
    record = room.record()
    assert record["choice"] == "main" and record["decided_by"] == [ANA, CY]


def test_an_expired_question_is_never_consent_and_later_votes_are_refused(tmp_path):
    room = room_with(tmp_path, expires="45s")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    record = room.record()
    assert record["state"] == "expired" and record["expired_at"] == format_rfc3339(T0 + 45_000)
    assert "choice" not in record and [v["sender"] for v in record["votes"]] == [ANA]
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any("expired undecided at 08:00:45 UTC: 1 of the 2 votes needed (\u201cThe main branch\u201d: "
               f"{ANA}). It is not approved" in s for s in said)
    room.deliver([answer("$b1", BO, T0 + 46_000, "main")])
    assert room.store.db.execute("SELECT reason FROM answer_log WHERE event_id='$b1'").fetchone()[0] == "expired"
    # A vote the room placed before the deadline still counts, even read after the close.
    room.deliver([answer("$c1", CY, T0 + 44_000, "main")])
    assert room.record()["state"] == "answered" and room.record()["decided_by"] == [ANA, CY]


def test_an_expired_record_keeps_the_votes_that_stood_at_the_deadline(tmp_path):
    """Ana's vote stood when the question expired; she took it back after
    the deadline, and Bo took his back before it.  The record keeps what
    stood at the deadline, as the room's closing words said: hers, not his."""
    room = room_with(tmp_path, expires="45s")
    room.deliver([answer("$b1", BO, T0 + 1000, "main"), redact("$rb", BO, T0 + 2000, "$b1"),
                  answer("$a1", ANA, T0 + 3000, "main")])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000).pass_once())
    assert [v["sender"] for v in room.record()["votes"]] == [ANA]
    room.deliver([redact("$ra", ANA, T0 + 50_000, "$a1")])  # after the deadline, in the room's order
    record = room.record()
    assert record["state"] == "expired" and [v["event_id"] for v in record["votes"]] == ["$a1"]
    assert room.verify() == []
    seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$ra'").fetchone()[0]
    told = room.pipeline.words.notice_for(room.store.log_entry(seq))["body"]
    assert told.endswith("(“The main branch”: @alice:hs). Your vote stood at the deadline; withdrawing "
                         "it now does not change that."), told


def test_an_empty_vote_after_the_deadline_is_not_told_the_vote_it_empties_counts_again(tmp_path):
    """Ana voted in the poll; the question expired; she then sent an empty
    vote.  She was told "your earlier vote ... counts as your vote again" (the
    very vote she took back) and, in the same breath, that it stood at the deadline."""
    room = room_with(tmp_path, expires="45s")
    room.deliver([vote("$a1", ANA, T0 + 3000, ["main"])])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000).pass_once())
    room.deliver([vote("$a2", ANA, T0 + 50_000, [])])  # after the deadline, in the room's order
    seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$a2'").fetchone()[0]
    told = room.pipeline.words.notice_for(room.store.log_entry(seq))["body"]
    assert "again" not in told and told.endswith("Your vote stood at the deadline; withdrawing it now does not "
                                                 "change that."), told


def test_a_pending_approval_rewritten_as_one_persons_answer_does_not_verify(tmp_path):
    """One vote of the two required: pending.  Rewritten as a plain record of
    that vote (its votes and required dropped, its receipt kept), it matched
    the vote's leaf, which hashes what one person's answer would, and verify
    held: an agent would act on an approval that never met its quorum."""
    room = room_with(tmp_path)
    (room.set_dir / "questions.json").write_text(json.dumps(approval_set(**APPROVAL)))
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    pending = room.record()
    assert pending["state"] == "pending" and room.verify() == []
    forged = {k: v for k, v in pending.items() if k not in ("votes", "required")}
    forged.update(state="answered", choice="main")
    doc = AnswersFile(room.set_dir).load()
    doc["answers"]["branch"] = forged
    (room.set_dir / "answers.json").write_text(json.dumps(doc))
    problems = room.verify()
    assert problems and "branch" in problems[0], problems


def test_an_expired_approval_keeps_its_subject_when_its_last_vote_is_taken_back_after_the_deadline(tmp_path):
    """A deploy's approval expires with Ana's poll vote standing; she empties
    her vote after the deadline.  No pick stands any more, but the expiry
    keeps her vote, and so what was to be approved: its subject, which her
    vote's leaf hashed (verify held the vote against a record without it)."""
    from helpers.sets import SUBJECT

    room = room_with(tmp_path, expires="45s", subject=dict(SUBJECT))
    room.deliver([vote("$v1", ANA, T0 + 1000, ["main"])])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000).pass_once())
    room.deliver([vote("$v2", ANA, T0 + 50_000, [])])
    record = room.record()
    assert record["state"] == "expired" and [v["event_id"] for v in record["votes"]] == ["$v1"]
    assert record["subject"] == {"id": SUBJECT["id"], "digest": SUBJECT["digest"]}
    assert room.verify() == []


@pytest.mark.parametrize("approval", [{"expires": "45s"}, {"expires": "45s", **APPROVAL}], ids=["alone", "quorum"])
def test_a_revision_nobody_answered_expires_itself_not_as_the_last_revisions_answer(tmp_path, approval):
    """Revision 1 answered, revision 2 posted with its own deadline and left
    unanswered: at that deadline revision 2 expired.  Its record kept the
    answer to revision 1 (alone: told "the answer given before it stands"; a
    quorum: expired, but of revision 1, so stale), and ``wait`` took neither
    for revision 2's outcome: it never returned."""
    room = Room(tmp_path, approval=approval, posted_ms=T0)
    raw = approval_set(**approval)
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    _revise(room, Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                            clock=lambda: (T0 + 3000) / 1000))
    next(q for q in raw["questions"] if q["id"] == "branch")["rev"] = 2
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000)
    asyncio.run(deadlines.pass_once())
    record = room.record()
    assert record["state"] == "expired" and record["q_rev"] == 2, record
    assert main(["wait", str(room.set_dir), "--question", "branch", "--timeout", "2"]) == 4


@pytest.mark.parametrize("answers, withdrawn, stood", [
    ([("$a1", "main")], "$a1", "main"),
    ([("$a1", "main"), ("$a2", "stable")], "$a2", "stable"),
], ids=["the only answer", "the later of two"])
def test_an_answer_that_stood_at_the_deadline_stays_when_taken_back_after_it(tmp_path, answers, withdrawn, stood):
    """No quorum: answered in time, closed at the deadline with "the answer
    given before it stands" (the agent told question.closed).  Taken back
    after the deadline, the record turned expired (or to the earlier
    answer), the room was told "expired undecided" and the agent
    question.expired: two outcomes for one question.  What stood at the
    deadline stands, as a quorum's expiry keeps the votes that stood."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    room.deliver([answer(event_id, ANA, T0 + 1000 * n, option) for n, (event_id, option) in enumerate(answers, 1)])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, on_closed=hook.closed, clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    assert room.record()["choice"] == stood
    room.deliver([redact("$r", ANA, T0 + 60_000, withdrawn)])
    asyncio.run(deadlines.pass_once())
    record = room.record()
    assert record["state"] == "answered" and record["choice"] == stood, record
    types = [json.loads(row.body)["type"] for row in due(room.store, 2**62)]
    assert "question.expired" not in types and types.count("question.closed") == 1, types
    said = [c.get("body", "") or c.get("m.new_content", {}).get("body", "") for c in room.pipeline.transport.sent]
    assert not any("expired undecided" in s for s in said), said
    seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$r'").fetchone()[0]
    told = room.pipeline.words.notice_for(room.store.log_entry(seq))["body"]
    assert "stood at the deadline" in told, told
    assert room.verify() == []


@pytest.mark.parametrize("answers", [[(ANA, "unsure")], [(ANA, "main"), (BO, "unsure")]],
                         ids=["not sure", "a pick, then someone not sure"])
def test_a_not_sure_given_before_the_deadline_stands_and_closes_the_question(tmp_path, answers, capsys):
    """answers-json.md: a question with `expires` and no quorum keeps the
    latest answer given before the deadline, `answered` or `unsure`.  A "not
    sure" expired as "no answer": the room was told nobody answered, the
    agent heard question.expired and `wait` exited 4."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    room.deliver([answer(f"$a{n}", who, T0 + 1000 * n, option) for n, (who, option) in enumerate(answers, 1)])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, on_closed=hook.closed,
                          clock=lambda: (T0 + 46_000) / 1000).pass_once())
    assert room.record()["state"] == "unsure"
    types = [json.loads(row.body)["type"] for row in due(room.store, 2**62)]
    assert "question.expired" not in types and types.count("question.closed") == 1, types
    said = [c.get("body", "") or c.get("m.new_content", {}).get("body", "") for c in room.pipeline.transport.sent]
    assert not any("expired undecided" in s for s in said) and any("given before it stands" in s for s in said), said
    # No answer can come now: wait says so at once (exit 2, the question
    # closed), where it waited out its timeout; read shows the close.
    raw = all_kinds_set("kinds")
    next(q for q in raw["questions"] if q["id"] == "branch").update(expires="45s")
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    started = time.monotonic()
    assert main(["wait", str(room.set_dir), "--question", "branch", "--timeout", "30"]) == 2
    assert time.monotonic() - started < 10
    assert "'branch' is closed: it can get no answer now" in capsys.readouterr().err
    assert main(["read", str(room.set_dir)]) == 0
    entry = next(e for e in json.loads(capsys.readouterr().out)["answers"] if e["qid"] == "branch")
    assert (entry["state"], entry["status"], entry["closed_at"]) == ("unsure", "closed", format_rfc3339(T0 + 45_000))
    assert room.verify() == []


def test_an_early_vote_edited_after_the_escalation_is_judged_as_a_new_answer(tmp_path):
    """Dee, escalated to after 10 s, voted at 5 s (refused: not an answerer
    yet) and edited the vote at 12 s.  The edit was refused "missing_field"
    (it does not say which question it answers): it inherited its question
    only from an accepted original."""
    room = Room(tmp_path, approval={"answerers": [ANA, BO], "quorum": {"required": 2},
                                    "escalate": {"after": "10s", "to": [DEE]}, "expires": "45s"}, posted_ms=T0)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$d1", DEE, T0 + 5000, "main")])
    assert room.record()["state"] == "pending"
    room.deliver([edit("$d2", DEE, T0 + 12_000, "$d1", "main")])
    record = room.record()
    assert record["state"] == "answered" and record["choice"] == "main", record
    assert sorted(record["decided_by"]) == [ANA, DEE]
    assert room.verify() == []


def test_a_vote_on_a_replaced_revision_read_late_is_no_decision(tmp_path):
    """A 2-of-3 approval expired with no vote and the agent asked again
    (revision 2).  Then a vote placed before the first deadline arrived
    (its server had been cut off): the record became a plain "answered",
    an expired approval read as consent, with no votes and nobody deciding."""
    room = room_with(tmp_path, expires="45s")
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "expired"
    _revise(room, deadlines)
    room.deliver([answer("$late", CY, T0 + 30_000, "main")])  # to revision 1, in time, read now
    record = room.record()
    assert record["state"] != "answered" and "choice" not in record, record  # never consent
    assert room.verify() == []


def test_a_vote_taken_back_after_the_deadline_read_before_the_deadlines_pass_is_told_it_stood(tmp_path):
    """The bridge was down across the deadline; Ana's vote stood at it and
    she took it back after it.  Read at the start, before the deadlines
    pass (which waits for the backlog), the room's order already says the
    deadline passed: she is told her vote stood, and the agent hears an
    expired record with it, not an open question with no vote."""
    from bridge.service.answering.notices import Notices

    room = room_with(tmp_path, expires="45s")
    room.deliver([vote("$v1", ANA, T0 + 1000, ["main"])])
    # A sender's homeserver clock ahead (it stamps the time) expires nothing before the deadline.
    room.store.clock = type("At", (), {"now_ms": staticmethod(lambda: T0 + 50_000)})()
    logged: list = []
    room.pipeline.on_logged = logged.append
    room.deliver([vote("$v2", ANA, T0 + 50_000, [])])
    record = room.record()
    assert record["state"] == "expired" and [v["event_id"] for v in record["votes"]] == ["$v1"]
    assert [e.outcome for e in logged] == ["withdrawn"]
    room.pipeline.transport.sent.clear()
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    [said] = [c["body"] for c in room.pipeline.transport.sent if "withdraw" in c["body"]]
    assert "Your vote stood at the deadline; withdrawing it now does not change that." in said, said
    assert room.verify() == []


def test_a_take_back_stamped_past_the_deadline_before_it_came_expires_nothing(tmp_path):
    """The sender's homeserver stamps the time: one whose clock runs ahead
    must not expire a question still open by the bridge's clock."""
    room = room_with(tmp_path, expires="1h")
    room.store.clock = type("At", (), {"now_ms": staticmethod(lambda: T0 + 2000)})()
    room.deliver([vote("$v1", ANA, T0 + 1000, ["main"]), vote("$v2", ANA, T0 + 7_200_000, [])])
    assert not room.store.is_expired("$q") and (room.record() or {}).get("state") != "expired"


@pytest.mark.parametrize("first, then, said, unsaid", [
    ("reply", "poll vote", "your earlier answer, \u201cthe main branch\u201d, counts as your vote again", None),
    ("poll vote", "reply", "still", ("again", "earlier")),
], ids=["the reply before", "the reply after"])
def test_a_poll_vote_emptied_beside_a_reply_of_the_same_person_says_the_reply_counts(tmp_path, first, then, said,
                                                                                      unsaid):
    """Ana replied "main" and voted "main" in the poll, then emptied her poll
    vote: her reply is her vote.  With the reply first, she was told "your
    vote is withdrawn" (and her reply went on to decide the question); with
    the reply after, that her earlier answer counted again, where it had
    counted all along (an empty vote names no vote it takes back, so which
    came first was never looked at)."""
    from bridge.service.answering.notices import Notices

    made = {"reply": lambda ts: answer("$a1", ANA, ts, "main"), "poll vote": lambda ts: vote("$v1", ANA, ts, ["main"])}
    room = room_with(tmp_path)
    room.deliver([made[first](T0 + 1000), made[then](T0 + 2000)])
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    room.pipeline.transport.sent.clear()
    room.deliver([vote("$v2", ANA, T0 + 3000, [])])
    assert [v["event_id"] for v in room.record()["votes"]] == ["$a1"]
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    [told] = [c["body"] for c in room.pipeline.transport.sent if "withdrawn" in c["body"]]
    assert said in told.lower(), told
    assert not any(word in told for word in unsaid or ()), told


def test_an_unanswered_question_with_a_deadline_expires_with_nothing(tmp_path):
    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 45_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    record = room.record()
    assert record["state"] == "expired" and "votes" not in record and "choice" not in record


@pytest.mark.parametrize("approval", [{"expires": "45s"}, {"expires": "45s", **APPROVAL}], ids=["alone", "quorum"])
def test_read_shows_a_question_its_deadline_closed_undecided_as_closed_until_a_new_revision(tmp_path, approval, capsys):
    """PROTOCOL 2a: at expiry an undecided question closes.  ``read`` listed
    it ``status: open`` beside ``state: expired``, so an agent counting the
    open questions counted one nobody could answer any more."""
    room = Room(tmp_path, approval=approval, posted_ms=T0)
    raw = approval_set(**approval)
    raw["questions"] = [q for q in raw["questions"] if q["id"] == "branch"]  # the set's only question
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000).pass_once())

    def read_entry() -> dict[str, Any]:
        assert main(["read", str(room.set_dir)]) == 0
        return next(e for e in json.loads(capsys.readouterr().out)["answers"] if e["qid"] == "branch")

    entry = read_entry()
    assert (entry["status"], entry["state"], entry["expired_at"]) == ("closed", "expired", format_rfc3339(T0 + 45_000))
    # Still the outcome a wait for the set waits for: it ends the wait, exit 4
    # (not "no question of the set is open", exit 2).
    for until in ("answered", "all"):
        assert main(["wait", str(room.set_dir), "--until", until, "--timeout", "2"]) == 4
    capsys.readouterr()
    # Asked anew, the question is open again and the record answers the revision before.
    next(q for q in raw["questions"] if q["id"] == "branch")["rev"] = 2
    (room.set_dir / "questions.json").write_text(json.dumps(raw))
    entry = read_entry()
    assert (entry["status"], entry["state"], entry["stale"]) == ("open", "expired", True)


# -- wait ------------------------------------------------------------------------------


def test_wait_on_an_approval_that_expires_exits_4_and_prints_expired(tmp_path, capsys):
    room = room_with(tmp_path, expires="45s")
    (room.set_dir / "questions.json").write_text(json.dumps(approval_set(expires="45s", **APPROVAL)))
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.store.close()

    def expire() -> None:
        # The bridge's deadlines pass, a second into the wait (its own store connection, as in its own task).
        time.sleep(1.0)
        store = Store(room.store_path)
        pipeline = Pipeline(store=store, transport=Transport(), answerers=None, own_users=lambda u: u == "@bot:hs")
        asyncio.run(Deadlines(store, pipeline.transport, flush=pipeline.flush,
                              clock=lambda: (T0 + 46_000) / 1000).pass_once())
        store.close()

    thread = threading.Thread(target=expire, daemon=True)
    thread.start()
    assert main(["wait", str(room.set_dir), "--question", "branch", "--timeout", "30"]) == 4
    thread.join()
    out = json.loads(capsys.readouterr().out)
    entry = next(e for e in out["answers"] if e["qid"] == "branch")
    assert entry["state"] == "expired" and entry["votes"][0]["sender"] == ANA and "choice" not in entry
    assert AnswersFile(room.set_dir).load()["answers"]["branch"]["state"] == "expired"


# -- webhooks ---------------------------------------------------------------------------


def test_webhooks_tell_every_vote_with_the_votes_then_the_decision_or_the_expiry(tmp_path):
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = room_with(tmp_path, expires="45s")
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook

    def bodies() -> list[dict[str, Any]]:
        return [json.loads(row.body) for row in due(room.store, 2**62)]

    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    (first,) = bodies()
    assert first["type"] == "answer.accepted" and first["state"] == "pending" and first["required"] == 2
    assert [v["sender"] for v in first["votes"]] == [ANA]
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          on_decided=hook.decided, on_expired=hook.expired, clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    expired = next(b for b in bodies() if b["type"] == "question.expired")
    assert expired["state"] == "expired" and "choice" not in expired["record"]
    assert expired["qid"] == "branch" and expired["question_event_id"] == "$q"


def test_a_question_answered_before_its_deadline_is_closed_by_it_not_expired(tmp_path):
    """No quorum, answered in time: at the deadline the answer stands.  The
    log had an "expired" leaf for it and the agent a question.expired (whose
    record said answered), so a record forged to expired would verify."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.protocol.audit_leaf import parse_leaf
    from bridge.service.config import Agent

    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, on_closed=hook.closed, clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and room.record()["choice"] == "main"
    assert not room.store.question_by_event("$q").open
    bodies = [json.loads(row.body) for row in due(room.store, 2**62)]
    assert [b["type"] for b in bodies] == ["answer.accepted", "question.closed"]
    assert "deadline" in bodies[1]["why"]
    leaves = [parse_leaf(leaf.encode()) for _i, leaf in room.store.audit.leaves(0, 100)]
    assert [leaf["outcome"] for leaf in leaves][-2:] == ["accepted", "closed"]
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any("the answer given before it stands" in s for s in said)


def test_a_decision_is_told_once_as_question_decided(tmp_path):
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = room_with(tmp_path)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          on_decided=hook.decided, on_expired=hook.expired, clock=lambda: (T0 + 3000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    asyncio.run(deadlines.pass_once())
    bodies = [json.loads(row.body) for row in due(room.store, 2**62)]
    assert [b["type"] for b in bodies] == ["answer.accepted", "answer.accepted", "question.decided"]
    assert bodies[1]["state"] == "answered" and [v["sender"] for v in bodies[1]["votes"]] == [ANA, BO]
    assert bodies[2]["record"]["decided_by"] == [ANA, BO] and bodies[2]["record"]["choice"] == "main"
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any("Decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs." in s for s in said)


def _with_webhooks(room: Room, now_ms: int) -> tuple[Any, Deadlines, Any]:
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, clock=lambda: now_ms / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    return hook, deadlines, lambda: [json.loads(row.body) for row in due(room.store, 2**62)]


def test_a_decision_a_late_veto_changes_is_a_new_question_decided(tmp_path):
    # Two votes decide it; then a veto the room placed before them is read
    # (its server was cut off): vetoed now.  An agent acting on
    # question.decided must hear the new decision, not only the room.
    room = room_with(tmp_path)
    _hook, deadlines, bodies = _with_webhooks(room, T0 + 5000)
    room.deliver([answer("$a1", ANA, T0 + 2000, "main"), answer("$b1", BO, T0 + 3000, "main")])
    asyncio.run(deadlines.pass_once())
    room.deliver([answer("$c1", CY, T0 + 1000, "stable")])
    asyncio.run(deadlines.pass_once())
    asyncio.run(deadlines.pass_once())
    decided = [b for b in bodies() if b["type"] == "question.decided"]
    assert [(b["record"]["choice"], b["record"]["decided_by"]) for b in decided] == \
        [("main", [ANA, BO]), ("stable", [CY])]
    assert decided[0]["id"] != decided[1]["id"]
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any(s.startswith("Vetoed") for s in said)


def test_a_decision_undone_by_a_late_redaction_is_told_and_a_later_decision_too(tmp_path):
    # Ana voted and took it back; the take-back is read after Bo's vote
    # decided it with hers.  answers.json is pending again: so must the room
    # be, and the next vote that decides it is told to the room and the agent.
    room = room_with(tmp_path)
    _hook, deadlines, bodies = _with_webhooks(room, T0 + 9000)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 3000, "main")])
    asyncio.run(deadlines.pass_once())
    room.deliver([redact("$a1-gone", ANA, T0 + 2000, "$a1")])
    assert room.record()["state"] == "pending"
    asyncio.run(deadlines.pass_once())
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any(s.startswith("The decision is undone") and "1 of the 2 votes needed" in s for s in said), said
    edits = [c for c in room.pipeline.transport.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert "Undecided again: 1 of the 2 votes needed" in edits[-1]["m.new_content"]["body"]
    room.deliver([answer("$c1", CY, T0 + 8000, "main")])
    asyncio.run(deadlines.pass_once())
    assert room.record()["decided_by"] == [BO, CY]
    decided = [b for b in bodies() if b["type"] == "question.decided"]
    assert [b["record"]["decided_by"] for b in decided] == [[ANA, BO], [BO, CY]]
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert said[-1:] != [] and any("by @bob:hs and @carol:hs" in s for s in said)


# -- bad input -------------------------------------------------------------------------


def test_an_edit_of_someone_elses_vote_and_a_strangers_veto_change_nothing(tmp_path):
    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    # Bob "edits" Alice's vote into the veto: not her edit, so not her vote.
    room.deliver([edit("$b-edit", BO, T0 + 2000, "$a1", "stable")])
    record = room.record()
    assert record["state"] == "pending" and [(v["sender"], v["choice"]) for v in record["votes"]] == [(ANA, "main")]
    # A room member outside the answerers picks the veto: refused, naming who may answer; nothing decided.
    room.deliver([answer("$e1", DEE, T0 + 3000, "stable")])
    reason, message = room.store.db.execute("SELECT reason, message FROM answer_log WHERE event_id='$e1'").fetchone()
    assert reason == "not_an_answerer" and ANA in message
    assert room.record()["state"] == "pending"


def test_an_escalation_mentions_its_people_in_the_thread_once(tmp_path):
    room = room_with(tmp_path, escalate={"after": "30m", "to": [DEE]})
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    for minutes in (29, 30, 31):
        asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                              clock=lambda m=minutes: (T0 + m * 60_000) / 1000).pass_once())
    mentions = [c for c in room.pipeline.transport.sent if c.get("m.mentions", {}).get("user_ids") == [DEE]]
    assert len(mentions) == 1
    assert mentions[0]["body"] == f"{DEE}: \u201cRelease branch\u201d is still undecided; you may answer it now."
    assert mentions[0]["m.relates_to"]["rel_type"] == "m.thread" and mentions[0]["m.relates_to"]["event_id"] == "$q"
    # From then on (in the room's order) they may answer.
    room.deliver([answer("$d1", DEE, T0 + 31 * 60_000, "main")])
    assert [v["sender"] for v in room.record()["votes"]] == [DEE]


def test_a_decision_undone_before_the_escalation_still_calls_its_people_in(tmp_path):
    # Decided five minutes in, then undone by a take-back read late: the
    # question is open to votes again, so at half an hour its escalation
    # must still call the moderator in, once (it was dropped with the decision).
    room = room_with(tmp_path, expires="2h", escalate={"after": "30m", "to": [DEE]})
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")

    def pass_at(minutes: int) -> None:
        asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                              clock=lambda: (T0 + minutes * 60_000) / 1000).pass_once())

    room.deliver([answer("$a1", ANA, T0 + 60_000, "main"), answer("$b1", BO, T0 + 180_000, "main")])
    pass_at(5)
    room.deliver([redact("$a1-gone", ANA, T0 + 120_000, "$a1")])
    pass_at(6)
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert any(s.startswith("The decision is undone") for s in said), said
    # The message open again counts the time left from the undo, not from the posting.
    (reopened,) = [c["m.new_content"]["body"] for c in room.pipeline.transport.sent
                   if "Undecided again" in c.get("m.new_content", {}).get("body", "")]
    assert "Answer by 10:00 UTC." in reopened.split("\n")
    for minutes in (29, 31, 32):
        pass_at(minutes)
    mentions = [c for c in room.pipeline.transport.sent if c.get("m.mentions", {}).get("user_ids") == [DEE]]
    assert len(mentions) == 1 and "is still undecided" in mentions[0]["body"]


# -- the homeserver's delayed closing edit says what stood ----------------------------------


def test_the_words_at_expiry_say_what_stood():
    from bridge.protocol.quorum import expiry_words

    at = T0 + 45_000
    one = {"state": "pending", "votes": [{"sender": ANA, "choice": "main"}], "required": 2}
    labels = {"main": "The main branch", "stable": "The stable branch"}
    assert expiry_words(None, 2, at, labels)[1] == "expired undecided at 08:00:45 UTC: no votes"
    # What stood is named (which option, whose votes), so "1 of 2" is not read as a result.
    assert expiry_words(one, 2, at, labels) == (
        "This question expired undecided at 08:00:45 UTC: 1 of the 2 votes needed (\u201cThe main branch\u201d: "
        f"{ANA}). It is not approved, and later answers are not recorded.",
        f"expired undecided at 08:00:45 UTC: 1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})")
    split = {**one, "votes": [*one["votes"], {"sender": BO, "choice": "stable"}]}
    assert expiry_words(split, 3, at, labels)[1].endswith(
        f": no option had the 3 votes needed (\u201cThe main branch\u201d: {ANA}; \u201cThe stable branch\u201d: {BO})")
    # Without a quorum: an answer given in time stands; none, and it expired with nothing.
    assert expiry_words({"state": "answered", "choice": "main"}, None, at)[1] == "closed at its deadline, 08:00:45 UTC"
    assert expiry_words(None, None, at)[1] == "expired undecided at 08:00:45 UTC: no answer"


def test_a_voter_in_a_tie_hears_the_count_of_their_own_option_too():
    # 1 each for two options: the words named only the option voted first,
    # so the second voter heard "1 of 2 for" the option they voted against.
    from bridge.protocol.quorum import PENDING, Tally, progress_words

    labels = {"main": "The main branch", "stable": "The stable branch"}
    split = Tally(PENDING, [{"sender": ANA, "choice": "stable"}, {"sender": BO, "choice": "main"}])
    assert progress_words(split, 2, [ANA, BO, CY], labels) == (
        f"1 of 2 for \u201cThe stable branch\u201d, 1 for \u201cThe main branch\u201d so far; waiting for {CY}.")
    ahead = Tally(PENDING, [*split.votes, {"sender": CY, "choice": "main"}])
    assert progress_words(ahead, 3, [ANA, BO, CY], labels).startswith(
        "2 of 3 for \u201cThe main branch\u201d, 1 for \u201cThe stable branch\u201d so far; ")


def test_the_progress_says_whose_votes_are_all_needed_and_when_agreement_is_out_of_reach():
    """3 of 3 needed, one in: "waiting for @b or @c", as if either would
    do; and with everyone voted on a split, nothing said it can't be decided."""
    from bridge.protocol.quorum import PENDING, Tally, progress_words

    labels = {"main": "The main branch", "stable": "The stable branch"}
    one = Tally(PENDING, [{"sender": ANA, "choice": "main"}])
    assert progress_words(one, 3, [ANA, BO, CY], labels) == (
        f"1 of 3 for \u201cThe main branch\u201d so far; waiting for {BO} and {CY}.")
    assert progress_words(one, 2, [ANA, BO, CY], labels) == (
        f"1 of 2 for \u201cThe main branch\u201d so far; waiting for {BO} or {CY}.")
    split = Tally(PENDING, [*one.votes, {"sender": BO, "choice": "stable"}])
    assert progress_words(split, 3, [ANA, BO, CY], labels) == (
        "1 of 3 for \u201cThe main branch\u201d, 1 for \u201cThe stable branch\u201d so far; with only "
        f"{CY} left to vote, no option can get the 3 agreeing votes needed unless someone changes their vote.")
    everyone = Tally(PENDING, [*split.votes, {"sender": CY, "choice": "main"}])
    assert progress_words(everyone, 3, [ANA, BO, CY], labels) == (
        "2 of 3 for \u201cThe main branch\u201d, 1 for \u201cThe stable branch\u201d so far; with no one left "
        "to vote, no option can get the 3 agreeing votes needed unless someone changes their vote.")


class Delaying(Transport):
    """A homeserver with delayed events (MSC4140): a retried transaction id gets the same delay id back."""

    def __init__(self, die_after_put: bool = False) -> None:
        super().__init__()
        self.delayed: dict[str, tuple[str, dict[str, Any], int]] = {}
        self.by_txn: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.die_after_put = die_after_put
        self.taken = 0  # delay ids handed out
        self.since: dict[str, int] = {}
        self.sealed = False  # an encrypted room: the list shows ciphertext only
        self.now_ms = 0  # the homeserver's clock: when a delay starts running

    async def send_delayed(self, room_id: str, event_type: str, content: dict[str, Any], txn: str,
                           delay_ms: int) -> str:
        if txn not in self.by_txn:
            self.by_txn[txn] = f"d{self.taken}"
            self.taken += 1
            self.delayed[self.by_txn[txn]] = (event_type, content, delay_ms)
            self.since[self.by_txn[txn]] = self.now_ms
            if self.die_after_put:
                raise KeyboardInterrupt("killed after the homeserver took it")
        return self.by_txn[txn]

    async def cancel_delayed(self, delay_id: str) -> bool:
        self.cancelled.append(delay_id)
        return self.delayed.pop(delay_id, None) is not None  # False: sent already (``fire``) or cancelled

    def fire(self, delay_id: str) -> None:
        """The homeserver sends a delayed event as it falls due."""
        kind, content, _delay = self.delayed.pop(delay_id)
        self.sent.append({**content, "type_sent": kind})

    async def list_delayed(self) -> list[dict[str, Any]]:
        sealed = {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA..."}
        return [{"delay_id": delay_id, "room_id": ROOM, "type": "m.room.encrypted" if self.sealed else kind,
                 "delay": delay, "running_since": self.since[delay_id], "content": sealed if self.sealed else content}
                for delay_id, (kind, content, delay) in self.delayed.items()]

    def closing_edits(self) -> list[tuple[str, int]]:
        """What the scheduled closing edits say (the closed line), with their delays."""
        return [(content["m.new_content"]["body"].rsplit("\n", 1)[-1], delay) for kind, content, delay
                in self.delayed.values() if content.get("m.relates_to", {}).get("rel_type") == "m.replace"]


def scheduled(tmp_path: Path, hs: "Delaying", **fields: Any) -> tuple[Room, Deadlines, list[int]]:
    """The approval posted with ``fields`` and its delayed events handed to
    ``hs``: the room, the deadlines and their clock (ms, to move on)."""
    room = room_with(tmp_path, **fields)
    room.pipeline.transport = hs
    clock = [T0 + 1000]
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll" if "expires" in fields else None))
    return room, deadlines, clock


def test_the_delayed_closing_edit_is_restated_as_the_votes_change(tmp_path):
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    clock = [T0 + 1000]
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll"))
    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert hs.closing_edits() == [(closed.format("no votes"), 44_000)]
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())
    # One closing edit still, saying what stands, for the time left; the first one cancelled.
    assert hs.closing_edits() == [(closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})"), 40_000)]
    assert hs.cancelled == ["d1"] and "d0" in hs.delayed  # d0: the poll end, untouched
    asyncio.run(deadlines.pass_once())
    assert len(hs.by_txn) == 3  # nothing changed, nothing sent again
    # A withdrawn vote is restated too.
    room.deliver([redact("$r1", ANA, T0 + 6000, "$a1")])
    clock[0] = T0 + 7000
    asyncio.run(deadlines.pass_once())
    assert hs.closing_edits() == [(closed.format("no votes"), 38_000)]
    # Decided: the poll end and every closing edit ever scheduled are cancelled.
    room.deliver([answer("$a3", ANA, T0 + 8000, "main"), answer("$b1", BO, T0 + 9000, "main")])
    clock[0] = T0 + 10_000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and hs.delayed == {}


def test_a_restatement_that_could_not_be_encrypted_leaves_the_closing_to_the_bridge(tmp_path):
    """Someone's join threw the room key away, so the restated closing edit
    could not be encrypted: the stale one stayed scheduled ("no votes"), yet
    the new words were noted as handed over, and at the deadline the bridge
    took the homeserver's edit for one that said the vote: the question
    closed saying "no votes" after the room was told "1 of 2"."""
    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    handed = hs.send_delayed
    refusing = [True]

    async def unencryptable(room_id, event_type, content, txn, delay_ms):
        return None if refusing[0] else await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = unencryptable
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())
    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert hs.closing_edits() == [(closed.format("no votes"), 44_000)]  # the stale one: all the homeserver has
    # At the deadline the homeserver sends it; the bridge's own edit, after it, says what stood.
    clock[0] = T0 + 46_000
    hs.fire(next(d for d, (_k, c, _t) in hs.delayed.items() if c.get("m.relates_to", {}).get("rel_type") == "m.replace"))
    asyncio.run(deadlines.pass_once())
    edits = [c["m.new_content"]["body"].rsplit("\n", 1)[-1] for c in hs.sent
             if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert edits[-1] == closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})"), edits
    assert deadlines._refused_until == {}  # the refusal's hold went with the question


def test_a_restatement_refused_once_goes_through_at_the_next_pass(tmp_path):
    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    handed, refusals = hs.send_delayed, [1]

    async def refused_once(room_id, event_type, content, txn, delay_ms):
        if refusals[0]:
            refusals[0] -= 1
            return None
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = refused_once
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())
    clock[0] = T0 + 6000
    asyncio.run(deadlines.pass_once())  # not tried again every second
    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert hs.closing_edits() == [(closed.format("no votes"), 44_000)]
    clock[0] = T0 + 10_000
    asyncio.run(deadlines.pass_once())
    assert hs.closing_edits() == [(closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})"),
                                   35_000)]


class KeyedDelaying(Delaying):
    """An encrypted room's homeserver: ``readers`` are the devices the room
    key in use went to (none: none in use), ``devices`` the room's now."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: frozenset[tuple[str, str]] = frozenset({(ANA, "PHONE")})
        self.readers = self.devices
        self.shared = 0  # room keys shared

    def key_recipients(self, room_id: str) -> frozenset[tuple[str, str]]:
        return self.readers

    async def share_room_key(self, room_id: str) -> None:
        if not self.readers:
            self.readers, self.shared = self.devices, self.shared + 1

    async def send_delayed(self, room_id: str, event_type: str, content: dict[str, Any], txn: str,
                           delay_ms: int) -> str:
        await self.share_room_key(room_id)  # encrypted under the key in use, one shared first if none
        return await super().send_delayed(room_id, event_type, content, txn, delay_ms)


def kinds_scheduled(hs: Delaying) -> list[str]:
    """What the homeserver holds, by kind: the poll end, closing edits, escalations."""
    def kind(event_type: str, content: dict[str, Any]) -> str:
        if event_type != "m.room.message":
            return "poll_end"
        return "edit" if content.get("m.relates_to", {}).get("rel_type") == "m.replace" else "escalate"
    return sorted(kind(event_type, content) for event_type, content, _delay in hs.delayed.values())


@pytest.mark.parametrize("expires", ["45s", None], ids=["with-a-deadline", "escalation-only"])
def test_someone_joining_has_each_delayed_event_handed_over_again_once(tmp_path, expires):
    """Bob joins: each delayed event is handed over again under the key he
    gets, and the one under the old key cancelled, also an escalation with
    no deadline beside it (it was left scheduled, and pinged its people twice)."""
    fields = {"escalate": {"after": "30s", "to": [DEE]}, **({"expires": expires} if expires else {})}
    hs = KeyedDelaying()
    room, deadlines, clock = scheduled(tmp_path, hs, **fields)
    first = kinds_scheduled(hs)
    assert first == (["edit", "escalate", "poll_end"] if expires else ["escalate"])
    clock[0] = T0 + 2000
    asyncio.run(deadlines.pass_once())
    assert hs.cancelled == []  # nobody came: nothing handed over again
    hs.readers = frozenset()  # a restart (no key kept): the same people, nothing handed over again
    asyncio.run(deadlines.pass_once())
    assert hs.cancelled == [] and hs.shared == 1 and kinds_scheduled(hs) == first
    hs.devices, hs.readers = hs.devices | {(BO, "LAPTOP")}, frozenset()  # Bob joins: the key goes
    clock[0] = T0 + 3000
    asyncio.run(deadlines.pass_once())
    assert kinds_scheduled(hs) == first and len(hs.cancelled) == len(first)
    asyncio.run(deadlines.pass_once())
    assert kinds_scheduled(hs) == first and len(hs.cancelled) == len(first)  # once


def test_a_handing_over_cut_short_and_done_again_keeps_what_it_handed_over(tmp_path):
    """Stopped between handing the poll end over again and noting that it
    was all done: the next try sends the same transactions, and the
    homeserver hands back the same poll end, which was then taken for the
    old one and cancelled; at the decision the bridge took it for sent by
    the homeserver, and the poll was never ended."""
    hs = KeyedDelaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s", escalate={"after": "30s", "to": [DEE]})
    handed, cut = hs.send_delayed, [True]  # (the posting's own handing over is done)

    async def stopped_midway(room_id, event_type, content, txn, delay_ms):
        escalation = event_type == "m.room.message" and "m.new_content" not in content
        if cut[0] and escalation:  # the escalation's second handing over: the first went at the posting
            cut[0] = False
            raise RuntimeError("the bridge stopped here")
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.devices, hs.readers = hs.devices | {(BO, "LAPTOP")}, frozenset()
    hs.send_delayed = stopped_midway
    clock[0] = T0 + 2000
    asyncio.run(deadlines.pass_once())  # the poll end handed over again; stopped before the rest
    asyncio.run(deadlines.pass_once())  # done again, the same transactions
    assert kinds_scheduled(hs) == ["edit", "escalate", "poll_end"]
    current = json.loads(room.store.get_meta("delays:" + room.posted.event_id))
    assert current["poll_end"] in hs.delayed and current["escalate"] in hs.delayed


def test_a_pass_while_the_first_scheduling_is_under_way_leaves_it_alone(tmp_path):
    """The poster's task hands the delayed events over one by one while the
    pass runs beside it: a pass in between took the half-scheduled posting
    for one under an unknown key, handed its poll end over again, and the
    scheduling's own write then dropped the new one from the store (two
    poll ends at the deadline, one of them untracked)."""
    room = room_with(tmp_path, expires="45s")
    hs = KeyedDelaying()
    room.pipeline.transport = hs
    clock = [T0 + 1000]
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    handed, held = hs.send_delayed, asyncio.Event()

    async def slow_edit(room_id, event_type, content, txn, delay_ms):
        if content.get("m.relates_to", {}).get("rel_type") == "m.replace":
            await held.wait()
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = slow_edit

    async def both() -> None:
        scheduling = asyncio.ensure_future(deadlines.schedule(room.posted, "$poll"))
        await asyncio.sleep(0.05)  # the poll end is handed over, the edit under way
        await deadlines.pass_once()
        held.set()
        await scheduling
        await deadlines.pass_once()

    asyncio.run(both())
    assert kinds_scheduled(hs) == ["edit", "poll_end"] and hs.cancelled == []
    assert sorted(json.loads(room.store.get_meta("delays:" + room.posted.event_id)).values()) == sorted(hs.delayed)


def test_a_decision_undone_hands_the_closing_edit_and_the_escalation_to_the_homeserver_again(tmp_path):
    """Decided, so the homeserver's closing edit and escalation were
    cancelled; then undone by a take-back read late: open to votes again.
    The bridge down from then on, nothing closed it at its deadline (nor
    called the moderator in); now the homeserver has both again, under new
    transaction ids, and a vote after the undo restates the edit."""
    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s", escalate={"after": "30s", "to": [DEE]})
    room.deliver([answer("$a1", ANA, T0 + 2000, "main"), answer("$b1", BO, T0 + 4000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and hs.delayed == {}  # decided: all cancelled
    room.deliver([redact("$a1-gone", ANA, T0 + 3000, "$a1")])  # taken back before Bo's vote, read late
    clock[0] = T0 + 6000
    asyncio.run(deadlines.pass_once())
    assert any(c.get("body", "").startswith("The decision is undone") for c in hs.sent)
    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert hs.closing_edits() == [(closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {BO})"),
                                   39_000)]
    escalations = [content for kind, content, delay in hs.delayed.values() if content.get("m.mentions")]
    assert [e["m.mentions"]["user_ids"] for e in escalations] == [[DEE]]
    room.deliver([redact("$b1-gone", BO, T0 + 6500, "$b1")])
    clock[0] = T0 + 7000
    asyncio.run(deadlines.pass_once())
    assert hs.closing_edits() == [(closed.format("no votes"), 38_000)]  # restated, not an old delay id
    room.deliver([answer("$c1", CY, T0 + 7500, "stable")])  # a veto
    clock[0] = T0 + 8000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and hs.delayed == {}  # decided again: cancelled again


def test_a_vote_in_time_read_after_the_homeservers_poll_end_decides_it_without_a_second_poll_end(tmp_path):
    # The bridge frozen (or a new leader taking over) across the deadline: the
    # homeserver ended the poll at it; the vote placed before it decides the
    # question, and the bridge does not end the poll a second time.
    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    asyncio.run(deadlines.pass_once())
    (poll_end,) = [d for d, (kind, _c, _delay) in hs.delayed.items() if kind == "org.matrix.msc3381.poll.end"]
    hs.fire(poll_end)
    room.deliver([answer("$b1", BO, T0 + 44_000, "main")])
    clock[0] = T0 + 46_000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and room.record()["decided_by"] == [ANA, BO]
    ends = [c for c in hs.sent if "org.matrix.msc3381.poll.end" in c]
    assert len(ends) == 1 and ends[0].get("type_sent"), ends  # the homeserver's, and no other
    assert any(c.get("body", "").startswith("Decided") for c in hs.sent)


def test_the_first_pass_waits_for_the_first_look_into_the_rooms(tmp_path):
    # Appservice mode, a new leader: a vote the frozen leader never read is in
    # the rooms' timelines, not in a transaction.  Its first pass must not call
    # the question expired before that look.
    room = room_with(tmp_path, expires="45s")
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")

    async def scenario() -> tuple[bool, bool]:
        stop, looked = asyncio.Event(), asyncio.Event()
        running = asyncio.ensure_future(deadlines.run(stop, tick=0.05, after=looked))
        await asyncio.sleep(0.3)
        before = room.store.question_by_event("$q").open
        room.deliver([answer("$a1", ANA, T0 + 44_000, "main"), answer("$b1", BO, T0 + 44_500, "main")])
        looked.set()
        await asyncio.sleep(0.3)
        stop.set()
        await running
        return before, room.store.question_by_event("$q").closed_why == "decided"

    assert asyncio.run(scenario()) == (True, True)
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert not any("expired" in s for s in said), said


def test_an_escalation_due_at_or_after_the_deadline_is_not_handed_to_the_homeserver(tmp_path):
    # A duration against a time escapes lint; the homeserver would send the
    # mention while the bridge is down, to a question closed by then.
    deadline = format_rfc3339(T0 + 8000)
    room = room_with(tmp_path, expires=deadline, escalate={"after": "14s", "to": [DEE]})
    hs = Delaying()
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: (T0 + 1000) / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll"))
    assert [content["body"] for kind, content, _delay in hs.delayed.values() if "m.new_content" not in content
            and kind == "m.room.message"] == []
    assert len(hs.delayed) == 2  # the poll's end and the closing edit


def test_a_vote_just_before_a_stop_is_in_the_homeservers_closing_edit(tmp_path):
    # The closing edit was restated only by the pass each second: a bridge
    # stopped within that second left the homeserver to say "no votes" at
    # the deadline, while it was down, though a vote stood.
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: (T0 + 1000) / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll"))
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    stop = asyncio.Event()
    stop.set()
    asyncio.run(deadlines.run(stop))
    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert [words for words, _delay in hs.closing_edits()] == [
        closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})")]


def test_a_vote_is_in_the_homeservers_closing_edit_long_before_the_next_tick(tmp_path):
    # Restated only by the pass each second, a vote left the homeserver's edit
    # saying "no votes" for up to that second: a bridge killed (or frozen)
    # then, over the deadline, had the room told a decided approval expired
    # with nobody voting.  An answer logged wakes the pass for its posting.
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: (T0 + 1000) / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll"))
    room.pipeline.on_logged = lambda entry: deadlines.touch(entry.question_event_id)

    async def scenario() -> list[str]:
        stop = asyncio.Event()
        running = asyncio.ensure_future(deadlines.run(stop, tick=60))
        await asyncio.sleep(0.2)  # its first pass is done: the next is a minute away
        room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
        await asyncio.sleep(0.3)
        said = [words for words, _delay in hs.closing_edits()]
        stop.set()
        await running
        return said

    closed = "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: {})."
    assert asyncio.run(scenario()) == [closed.format(f"1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA})")]


def test_a_kill_between_scheduling_the_new_closing_edit_and_cancelling_the_old_leaves_one(tmp_path):
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    clock = [T0 + 1000]
    asyncio.run(Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
                .schedule(room.posted, "$poll"))
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = T0 + 5000
    # Killed once the homeserver has taken the new edit, before its delay id is written down.
    hs.die_after_put = True
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000).pass_once())
    assert len(hs.closing_edits()) == 2  # both scheduled for a moment, never neither
    hs.die_after_put = False
    room.crash()
    clock[0] = T0 + 8000
    asyncio.run(Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000).pass_once())
    closed = ("Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: 1 of the 2 votes needed "
              f"(\u201cThe main branch\u201d: {ANA})).")
    assert [words for words, _delay in hs.closing_edits()] == [closed]
    assert len(hs.by_txn) == 3  # the same transaction sent again: the same delay id, no third edit



def test_after_the_decision_a_deciders_changed_or_withdrawn_vote_is_told_the_decision_stands(tmp_path):
    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])

    def word_back(event_id: str) -> str:
        (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id=?", (event_id,)).fetchone()
        return room.pipeline.notice_for(room.store.log_entry(seq))["body"]
    # The deciding vote is told it decided; the decision itself is the thread's announcement, said once.
    assert word_back("$b1").endswith("With your vote it is decided.")
    assert "Decided:" not in word_back("$b1") and "does not change" not in word_back("$b1")
    # Bo, who decided it, changes his vote to the veto: recorded, the decision stands, and he is told so.
    room.deliver([edit("$b2", BO, T0 + 3000, "$b1", "stable")])
    assert word_back("$b2").endswith("Your vote is recorded; it does not change the decision.")
    # Ana withdraws hers: told it is withdrawn and that this changes nothing (not that an earlier answer stands).
    room.deliver([redact("$r1", ANA, T0 + 4000, "$a1")])
    told = word_back("$r1")
    # (Its acknowledgement not sent here, the word back goes to the thread, naming her.)
    assert told.startswith(f"{ANA}: Your vote to \u201cRelease branch\u201d is withdrawn. Decided: "
                           "\u201cThe main branch\u201d")
    assert told.endswith("Withdrawing it does not change the decision.") and "stands again" not in told
    assert room.record()["decided_by"] == [ANA, BO] and room.record()["choice"] == "main"


# -- what the room reads once it is closed, and whom it pings ---------------------------------


def _closed_lines(content: dict[str, Any]) -> list[str]:
    return content["m.new_content"]["body"].split("\n")


def test_a_closed_question_drops_its_stale_deadline_words_and_the_escalation_not_needed():
    from bridge.protocol.question_event import closed_replacement

    content = posted_before(posted(expires="2h", escalate={"after": "1h", "to": [DEE]}, **APPROVAL))
    # Decided half an hour in: the deadline did not come, nor the escalation.
    early = closed_replacement("$q", content, "decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs",
                               T0 + 30 * 60_000)
    lines = _closed_lines(early)
    assert "Deadline: 10:00 UTC (closed before it)." in lines
    assert not any("in 2 hours" in line or "Answer by" in line or DEE in line for line in lines)
    html = early["m.new_content"]["formatted_body"]
    assert "<em>Deadline: 10:00 UTC (closed before it).</em>" in html and "in 2 hours" not in html and DEE not in html
    # Expired: the deadline passed, and the escalation (at 09:00) did happen.
    late = closed_replacement("$q", content, "expired undecided at 10:00 UTC: no votes", T0 + 2 * 3_600_000)
    lines = _closed_lines(late)
    assert "Deadline: 10:00 UTC (passed)." in lines
    assert f"Undecided by 09:00 UTC: {DEE} was asked too." in lines
    assert lines[-1] == "Closed: no longer accepting answers (expired undecided at 10:00 UTC: no votes)."
    pill = f'<a href="https://matrix.to/#/{DEE}">{DEE}</a>'  # a person the bridge names; no ping (m.mentions)
    assert f"<em>Undecided by 09:00 UTC: {pill} was asked too.</em>" in late["m.new_content"]["formatted_body"]
    assert "will be asked" not in late["m.new_content"]["formatted_body"]


def test_a_veto_label_that_looks_like_a_link_or_an_id_stays_text_in_the_approval_lines_and_the_close():
    """Everywhere else the set's text is code where it looks like a link; the
    approval line ("… from anyone decides at once") and the closing line
    escaped it only, and Element linkified the domain and made @eve a pill."""
    from bridge.protocol.question_event import closed_replacement

    raw = approval_set(quorum={"required": 2, "veto": ["stable"]}, answerers=[ANA, BO])
    branch = next(q for q in raw["questions"] if q["id"] == "branch")
    label = "Block it, see status.example.org and @eve:example.org"
    next(o for o in branch["options"] if o["id"] == "stable")["label"] = label
    qset = QuestionSet.model_validate(raw)
    content = build_question_event(qset, next(q for q in qset.questions if q.id == "branch"), elicitation_id="elc",
                                   posted_ms=T0)
    coded = "<code>status.example.org</code> and <code>@eve:example.org</code>"
    assert f"Block it, see {coded}" in content["formatted_body"]
    closed = closed_replacement("$q", content, f"vetoed: \u201c{label}\u201d", T0 + 60_000)
    html = closed["m.new_content"]["formatted_body"]
    assert html.count(coded) == 3, html  # the approval line, the option, and the closing line


def test_the_question_mentions_its_answerers_and_its_edits_and_poll_end_ping_nobody(tmp_path):
    from bridge.protocol.poll import POLL_END, poll_start
    from bridge.protocol.question_event import closed_replacement

    content = posted(expires="2h", escalate={"after": "1h", "to": [DEE]}, **APPROVAL)
    # Asked by name: the answerers are notified; the escalation's people only when it comes.
    assert content["m.mentions"] == {"user_ids": [ANA, BO, CY]}
    assert posted()["m.mentions"] == {}  # no answerers: the body's user ids ping nobody
    edit_content = closed_replacement("$q", content, "closed")
    assert edit_content["m.mentions"] == {} and edit_content["m.new_content"]["m.mentions"] == content["m.mentions"]
    room = room_with(tmp_path, expires="45s")
    assert poll_start(room.posted)["m.mentions"] == {}
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 3000) / 1000).pass_once())
    sent = room.pipeline.transport.sent
    assert [c for c in sent if POLL_END in c] and all(c.get("m.mentions") == {} for c in sent)


def test_every_poll_end_reads_as_a_sentence_in_the_closing_lines_words():
    from bridge.protocol.poll import TEXT, deadline_poll_end, poll_end
    from bridge.protocol.quorum import Tally, decision_line, expiry_words

    labels = {"main": "The main branch", "stable": "The stable branch"}
    decided = decision_line(Tally("answered", [], "main", [ANA, BO]), labels)
    vetoed = decision_line(Tally("answered", [], "stable", [BO], veto=True), labels)
    one = {"state": "pending", "votes": [{"sender": ANA, "choice": "main"}]}
    texts = [poll_end("$poll", why)[TEXT] for why in (
        decided, vetoed, expiry_words(one, 2, T0, labels)[1], expiry_words(None, 2, T0, labels)[1],
        "withdrawn (Decided in the meeting)", "this set was removed", "closed")]
    assert texts == [
        f"The poll has ended. Decided: \u201cThe main branch\u201d by {ANA} and {BO}.",
        f"The poll has ended. Vetoed: \u201cThe stable branch\u201d by {BO}.",
        f"The poll has ended. Expired undecided at 08:00 UTC: 1 of the 2 votes needed (\u201cThe main branch\u201d: {ANA}).",
        "The poll has ended. Expired undecided at 08:00 UTC: no votes.",
        "The poll has ended. Withdrawn (Decided in the meeting).",
        "The poll has ended. This set was removed.",
        "The poll has ended. Closed.",
    ]
    # The homeserver's, scheduled at posting, is true whatever stood at the deadline.
    assert deadline_poll_end("$poll", T0 + 45_000)[TEXT] == "The poll has ended at its deadline, 08:00:45 UTC."


def test_a_veto_is_announced_as_a_veto_not_as_one_vote_among_others(tmp_path):
    from bridge.protocol.poll import POLL_END, TEXT

    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "stable")])
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 3000) / 1000).pass_once())
    sent = room.pipeline.transport.sent
    notice = next(c for c in sent if c.get("dev.superpipeline.question.approval"))
    assert notice["body"] == (f"Vetoed: \u201cThe stable branch\u201d by {BO}. "
                              "A veto decides at once, whatever the other votes.")
    # The people named are pills, and nobody is pinged.
    assert f'<a href="https://matrix.to/#/{BO}">{BO}</a>' in notice["formatted_body"] and notice["m.mentions"] == {}
    edit_content = next(c for c in sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace")
    assert _closed_lines(edit_content)[-1] == (
        f"Closed: no longer accepting answers (vetoed: \u201cThe stable branch\u201d by {BO}).")
    assert next(c for c in sent if POLL_END in c)[TEXT] == f"The poll has ended. Vetoed: \u201cThe stable branch\u201d by {BO}."
    # Bo's own word back says his veto decided it; the announcement says what was decided, once.
    (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$b1'").fetchone()
    told = room.pipeline.notice_for(room.store.log_entry(seq))
    assert told["body"].endswith("With your veto it is decided.") and "Vetoed" not in told["body"]


def test_at_expiry_the_bridge_does_not_repeat_the_homeservers_identical_closing_edit(tmp_path):
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    clock = [T0 + 1000]
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    asyncio.run(deadlines.schedule(room.posted, "$poll"))
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())  # the delayed edit restated: 1 vote stands
    (scheduled,) = [c for _kind, c, _delay in hs.delayed.values() if c.get("m.relates_to", {}).get("rel_type")
                    == "m.replace"]
    clock[0] = T0 + 46_000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "expired"
    # The homeserver's edit (and poll end) close it; the bridge says it in the thread only.
    assert [c for c in hs.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"] == []
    assert "1 of the 2 votes needed" in _closed_lines(scheduled)[-1]
    notice = next(c for c in hs.sent if c.get("dev.superpipeline.question.approval"))
    assert notice["body"].startswith("This question expired undecided at 08:00:45 UTC: 1 of the 2 votes needed")


def test_picking_something_else_in_the_poll_is_told_where_the_words_go(tmp_path):
    room = room_with(tmp_path)
    room.deliver([vote("$o1", ANA, T0 + 1000, ["other"])])
    (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$o1'").fetchone()
    told = room.pipeline.notice_for(room.store.log_entry(seq))["body"]
    assert told == (f"{ANA}: Not recorded: \u201cSomething else\u201d needs a few words from you, and a vote in the "
                    "poll carries none. Reply to the question with other: and your words.")


@pytest.mark.parametrize("typed", ["other", "number"])
def test_something_else_replied_without_words_is_told_the_form_that_carries_them(tmp_path, typed):
    """A reply "other" (or its number) was told to "add them as text", which
    a reply can't: it says the form a reply takes."""
    room = room_with(tmp_path)
    number = str(1 + [o["id"] for o in room.posted.options].index("other"))
    body = number if typed == "number" else typed
    room.deliver([{"event_id": "$o1", "room_id": ROOM, "sender": ANA, "origin_server_ts": T0 + 1000,
                   "type": "m.room.message",
                   "content": {"msgtype": "m.text", "body": body, "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}}}}])
    (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$o1'").fetchone()
    told = room.pipeline.notice_for(room.store.log_entry(seq))["body"]
    assert told == ("Not recorded: \u201cSomething else\u201d needs a few words from you. Reply with other: and your "
                    "words (for example \u201cother: only the unit tests\u201d).")


@pytest.mark.parametrize("sealed", [False, True], ids=["clear", "encrypted"])
def test_stray_delayed_events_past_the_homeservers_memory_of_the_transaction_are_cancelled_at_start(tmp_path,
                                                                                                   sealed):
    """Killed after the homeserver took a restated closing edit, down longer
    than it remembers the transaction: the retry schedules another, and the
    first is nobody's.  At start the bridge reads the homeserver's list and
    cancels it; for a question decided meanwhile, everything still scheduled.
    Encrypted, the list shows only ciphertext: they are told by when they are due."""
    room = room_with(tmp_path, expires="45s")
    hs = Delaying()
    hs.sealed = sealed
    clock = [T0 + 1000]
    hs.now_ms = T0 + 1000
    asyncio.run(Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
                .schedule(room.posted, "$poll"))
    room.deliver([answer("$a1", ANA, T0 + 2000, "main")])
    clock[0] = hs.now_ms = T0 + 5000
    hs.die_after_put = True
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000).pass_once())
    hs.die_after_put = False
    hs.by_txn.clear()  # the homeserver forgot the transaction ids
    room.crash()
    clock[0] = hs.now_ms = T0 + 8000
    deadlines = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    asyncio.run(deadlines.pass_once())
    assert len(hs.closing_edits()) == 2  # the retry's edit, and the stray the first attempt left
    assert asyncio.run(deadlines.sweep()) == 1
    closed = ("Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: 1 of the 2 votes needed "
              "(\u201cThe main branch\u201d: @alice:hs)).")
    assert [words for words, _delay in hs.closing_edits()] == [closed]
    assert "d0" in hs.delayed  # the poll end the store holds stays
    # Decided while the store had lost what it scheduled: nothing of it may still come.
    with room.store.transaction():
        room.store.delete_meta("delays:$q")
    room.deliver([answer("$b1", BO, T0 + 9000, "main")])
    clock[0] = T0 + 10_000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and hs.delayed  # the forgotten ones are still scheduled
    assert asyncio.run(deadlines.sweep()) == 2 and hs.delayed == {}


def _told_while_votes_arrive(tmp_path: Path, approval: dict[str, Any], late: list[dict[str, Any]],
                             before: list[dict[str, Any]] = ()):
    """The deadline passes with the bridge behind the room: the pass closes
    the question and, while it tells the room (a send the network holds up),
    the batch holding ``late`` (placed before the deadline) is read."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = Room(tmp_path, approval=approval, posted_ms=T0)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    if before:
        room.deliver(list(before))
    transport = room.pipeline.transport
    plain_send = transport.send

    async def send_while_the_batch_comes(room_id, event_type, content, txn_id):
        if late and "dev.superpipeline.question.approval" in content:
            room.deliver(late.copy())
            late.clear()
        return await plain_send(room_id, event_type, content, txn_id)

    transport.send = send_while_the_batch_comes
    deadlines = Deadlines(room.store, transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, on_closed=hook.closed, clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    for _ in range(3):
        asyncio.run(deadlines.pass_once())
    notices = [c["body"] for c in transport.sent if "dev.superpipeline.question.approval" in c]
    edits = [c["m.new_content"]["body"].rsplit("\n", 1)[-1] for c in transport.sent
             if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    hooks = [json.loads(row.body)["type"] for row in due(room.store, 2**62)]
    return room, notices, edits, hooks


def test_votes_read_while_the_room_hears_the_expiry_decide_it_and_the_room_hears_that_too(tmp_path):
    """Both votes were placed in time and read while the expiry was being
    told: answers.json said decided, and the room and the agent heard only
    "expired" for good (the pass stopped watching the question as it ended)."""
    room, notices, edits, hooks = _told_while_votes_arrive(
        tmp_path, {"answerers": [ANA, BO], "quorum": {"required": 2}, "expires": "45s"},
        [answer("$a1", ANA, T0 + 40_000, "main"), answer("$b1", BO, T0 + 41_000, "main")])
    assert room.record()["state"] == "answered" and room.record()["decided_by"] == [ANA, BO]
    assert notices[0].startswith("This question expired undecided")
    assert notices[1:] == ["Decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs."], notices
    assert edits[-1] == "Closed: no longer accepting answers (decided: \u201cThe main branch\u201d by @alice:hs and " \
                        "@bob:hs).", edits
    assert hooks.count("question.decided") == 1, hooks
    assert room.store.meta_with_prefix("approval:") == []
    # The poll was ended once, at the first telling (Element shows each end as "ended poll").
    assert sum("org.matrix.msc3381.poll.end" in c for c in room.pipeline.transport.sent) == 1


def test_an_answer_read_while_the_room_hears_the_expiry_stands_and_the_room_hears_that_too(tmp_path):
    """No quorum: an answer placed in time and read while the expiry was being
    told stands (answers.json says answered); the room, which heard "expired
    undecided ... no answer", now hears that the answer given in time stands,
    and the agent gets question.closed."""
    room, notices, edits, hooks = _told_while_votes_arrive(
        tmp_path, {"expires": "45s"}, [answer("$a1", ANA, T0 + 40_000, "main")])
    assert room.record()["state"] == "answered" and room.record()["choice"] == "main"
    assert notices[0].startswith("This question expired undecided")
    assert notices[1:] == [f"The deadline ({format_rfc3339(T0 + 45_000)}) has passed; the answer given before it "
                           "stands."], notices
    assert edits[-1] == "Closed: no longer accepting answers (closed at its deadline, 08:00:45 UTC).", edits
    assert hooks[-1] == "question.closed" and hooks.count("question.closed") == 1, hooks
    assert room.store.meta_with_prefix("approval:") == []


def test_the_deciding_vote_is_told_once_however_the_votes_were_batched(tmp_path):
    """Two votes deciding a 2 of 3, read in one batch (after a restart, say):
    both voters were told "With your vote it is decided"; read one by one,
    the first hears where the votes stood.  Now the same words either way."""
    told: dict[bool, list[str]] = {}
    for batched in (False, True):
        (tmp_path / str(batched)).mkdir()
        room = room_with(tmp_path / str(batched))
        votes = [answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")]
        told[batched] = []
        for batch in ([votes] if batched else [[v] for v in votes]):
            room.deliver(batch)  # each batch's word backs are made once it is in, as the pipeline's are
            for vote in batch:
                seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id=?",
                                            (vote["event_id"],)).fetchone()[0]
                told[batched].append(room.pipeline.words.notice_for(room.store.log_entry(seq))["body"])
    assert told[True] == told[False], told
    assert told[True][0].endswith("1 of 2 for \u201cThe main branch\u201d so far; waiting for @bob:hs or @carol:hs."), told
    assert told[True][1].endswith("With your vote it is decided."), told


def test_a_vote_taken_back_before_the_deadline_and_read_after_it_is_not_named_as_standing(tmp_path):
    """Ana's vote, withdrawn before the deadline, read after the room heard
    "expired undecided: 1 of the 2 votes needed (... Ana)": answers.json had
    no vote standing, the room went on naming hers."""
    room, notices, edits, hooks = _told_while_votes_arrive(
        tmp_path, {"answerers": [ANA, BO], "quorum": {"required": 2}, "expires": "45s"},
        [redact("$ra", ANA, T0 + 44_000, "$a0")], before=[answer("$a0", ANA, T0 + 30_000, "main")])
    assert room.record()["state"] == "expired" and room.record()["votes"] == []
    assert ANA in notices[0] and ANA not in notices[-1], notices
    assert notices[-1].startswith("This question expired undecided at 08:00:45 UTC: no votes"), notices
    assert ANA not in edits[-1], edits
    assert hooks.count("question.expired") == 1, hooks
    assert room.store.meta_with_prefix("approval:") == []


def test_a_decision_read_just_before_a_new_revision_closed_the_posting_is_announced(tmp_path):
    """Bo's vote decided revision 1 and was read; the agent's revision 2
    closed it ("replaced") before the once-a-second pass saw the decision:
    answers.json said decided, the room and the agent never heard it."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = room_with(tmp_path)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    with room.store.transaction():
        room.store.close_question("$q", "replaced by revision 2")
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          on_expired=hook.expired, clock=lambda: (T0 + 3000) / 1000)
    for _ in range(2):
        asyncio.run(deadlines.pass_once())
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert said.count("Decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs.") == 1, said
    hooks = [json.loads(row.body)["type"] for row in due(room.store, 2**62)]
    assert hooks.count("question.decided") == 1, hooks
    assert room.store.meta_with_prefix("approval:") == []


def _revise(room: Room, deadlines: Deadlines, *approval_dropped: str) -> RecordedQuestion:
    """The agent's revision 2, posted as the poster posts it: the replaced
    posting's record kept, the new posting recorded, the old one closed;
    ``approval_dropped``: the approval's fields revision 2 is asked without."""
    import copy

    content = copy.deepcopy(room.posted.content)
    content["question"]["rev"] = 2
    for name in approval_dropped:
        content["question"].pop(name, None)
    content["elicitation_id"] = "elc_branch_2"
    new = RecordedQuestion(event_id="$q2", room_id=room.posted.room_id, set_id="kinds", content=content)
    still_open = room.store.question_by_event("$q").open
    with room.store.transaction():
        if still_open:  # (the poster closes only what is open: a decided posting stays decided)
            deadlines.keep_record(room.posted, str(room.set_dir))
        room.store.record_posted(new, set_dir=str(room.set_dir), posted_at=2)
        if still_open:
            room.store.close_question("$q", "replaced by revision 2")
        room.store.set_meta("approval:$q2", "1")
    return new


def _vote_on(posting: RecordedQuestion, event_id: str, sender: str, ts: int, option: str) -> dict[str, Any]:
    event = answer(event_id, sender, ts, option)
    event["content"]["elicitation_id"] = posting.elicitation_id
    event["content"]["m.relates_to"]["event_id"] = posting.event_id
    return event


def test_a_replaced_revisions_thread_hears_its_own_outcome_never_the_next_revisions(tmp_path):
    """Revision 1 decided and told; revision 2 then vetoed: revision 1's thread
    was told "Vetoed", and its question edited to say so, every second pass
    comparing it with the question's record, by then revision 2's."""
    room = room_with(tmp_path, expires="1h")
    transport = room.pipeline.transport
    deadlines = Deadlines(room.store, transport, flush=room.pipeline.flush, clock=lambda: (T0 + 3000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    asyncio.run(deadlines.pass_once())
    told = len(transport.sent)
    assert "Decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs." in [c.get("body") for c in transport.sent]
    rev2 = _revise(room, deadlines)
    room.deliver([_vote_on(rev2, "$c2", CY, T0 + 4000, "stable")])  # the veto, on revision 2
    for _ in range(3):
        asyncio.run(deadlines.pass_once())
    about_rev1 = [c for c in transport.sent[told:]
                  if "$q" in json.dumps(c.get("m.relates_to", {})) and "$q2" not in json.dumps(c.get("m.relates_to", {}))]
    assert about_rev1 == [], about_rev1


def test_a_decision_revised_away_before_the_pass_saw_it_is_announced_with_its_own_words(tmp_path):
    """Ana and Bo decided revision 1; revision 2 was posted within the pass's
    second: the question's record was revision 2's (pending) by then, so the
    decision was never announced."""
    from bridge.agents.outbox import OutboxHook, due
    from bridge.agents.owner import OWNER_FILE
    from bridge.service.config import Agent

    room = room_with(tmp_path)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "a", "callbacks": ["https://hooks.example/a"]}))
    hook = OutboxHook(room.store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    room.pipeline.on_logged = hook
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush, on_decided=hook.decided,
                          clock=lambda: (T0 + 3000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    _revise(room, deadlines)
    for _ in range(2):
        asyncio.run(deadlines.pass_once())
    said = [c.get("body", "") for c in room.pipeline.transport.sent]
    assert said.count("Decided: \u201cThe main branch\u201d by @alice:hs and @bob:hs.") == 1, said
    decided = [json.loads(row.body) for row in due(room.store, 2**62) if "question.decided" in row.key]
    assert len(decided) == 1 and decided[0]["record"]["decided_by"] == [ANA, BO]
    assert room.store.get_meta("approval:$q") is None


def test_an_answer_to_a_revision_taken_back_after_an_earlier_revisions_deadline_verifies(tmp_path):
    """No quorum: revision 1 closed at its deadline with its answer standing,
    then revision 2 was answered and that answer taken back: the record goes
    back to revision 1's answer, as the room's order says.  verify held the
    withdrawal to revision 1's close (same question, another revision), kept
    revision 2's answer standing, and named the record as rolled back."""
    from helpers.timeline import redact

    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 46_000) / 1000)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    asyncio.run(deadlines.pass_once())
    import copy

    content = copy.deepcopy(room.posted.content)
    content["question"].update(rev=2)
    content["question"].pop("expires")  # revision 2 asked without a deadline
    content["elicitation_id"] = "elc_branch_2"
    second = RecordedQuestion(event_id="$q2", room_id=room.posted.room_id, set_id="kinds", content=content)
    with room.store.transaction():
        room.store.record_posted(second, set_dir=str(room.set_dir), posted_at=2)
    room.deliver([_vote_on(second, "$b2", BO, T0 + 50_000, "stable")])
    assert room.record()["q_rev"] == 2
    room.deliver([redact("$b2-gone", BO, T0 + 60_000, "$b2")])
    assert (room.record()["q_rev"], room.record()["choice"]) == (1, "main")
    assert room.verify() == []


def test_a_closing_edit_still_holds_the_question_for_clients_that_show_the_edit():
    # matrix-js-sdk's getContent() (and Element) show m.new_content in place of
    # the original: a closed question's content had lost suite_event_type,
    # question, elicitation_id and set, so a client could no longer tell it
    # was a question, nor judge an answer by it.
    from bridge.protocol.question_event import CONTENT_MAX_BYTES, SHOWN_CLOSED_KEY, closed_replacement, content_size

    content = posted(expires="2h", **APPROVAL)
    shown = closed_replacement("$q", content, "decided", T0 + 1000)["m.new_content"]
    for key in ("suite_event_type", "schema_version", "elicitation_id", "set", "question"):
        assert shown[key] == content[key]
    assert shown[SHOWN_CLOSED_KEY] == {"question_event_id": "$q", "why": "decided"}
    # A question near the event limit keeps its fields in the original only: the edit must still be sent.
    big = {**content, "body": "x" * 44_000, "question": {**content["question"], "question": "y" * 20_000}}
    edit = closed_replacement("$q", big, "decided", T0 + 1000)
    assert content_size(edit) <= CONTENT_MAX_BYTES and "question" not in edit["m.new_content"]
    # Whatever the question's size and the reason's length (the marker holds it twice), the edit fits.
    for pad in range(40_000, 62_000, 700):
        for why in ("decided", "withdrawn (" + "r" * 1000 + ")"):
            near = {**content, "question": {**content["question"], "question": "y" * pad}}
            assert content_size(closed_replacement("$q", near, why, T0 + 1000)) <= CONTENT_MAX_BYTES, (pad, why)


def test_a_votes_webhook_carries_the_questions_record_and_a_withdrawal_what_stands_now(tmp_path):
    """A single vote's webhook held the vote's own record ("answered", a
    choice) while answers.json said pending: an agent reading record.state
    took one vote for consent.  A withdrawal's held no record at all, and
    did not name what it took back."""
    room = room_with(tmp_path)
    _hook, _deadlines, bodies = _with_webhooks(room, T0 + 5000)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    [vote_body] = [b for b in bodies() if b["type"] == "answer.accepted"]

    def written(record: dict) -> dict:  # (``updated``: when judged, in the body; when written, in the file)
        return {k: v for k, v in record.items() if k != "updated"}

    assert written(vote_body["record"]) == written(room.record()) and vote_body["record"]["state"] == "pending"
    assert "choice" not in vote_body["record"]

    (tmp_path / "plain").mkdir()
    plain = Room(tmp_path / "plain")
    _hook, _deadlines, plain_bodies = _with_webhooks(plain, T0 + 5000)
    plain.deliver([answer("$p1", ANA, T0 + 1000, "stable"), answer("$p2", ANA, T0 + 2000, "main")])
    plain.deliver([redact("$p2-gone", ANA, T0 + 3000, "$p2")])
    [withdrawn] = [b for b in plain_bodies() if b["type"] == "answer.withdrawn"]
    assert withdrawn["withdrawn_event_id"] == "$p2" and withdrawn["record"]["choice"] == "stable"
    assert written(withdrawn["record"]) == written(plain.record())


def test_a_vote_on_revision_2_taken_back_leaves_revision_1s_decision_as_it_stood(tmp_path):
    """Revision 1 decided 2 of 2, then revision 2 posted: the record kept
    revision 1's decision.  A vote on revision 2, taken back, left no vote
    standing on it, as before; yet the record turned "pending" with no
    votes, of revision 1, its decision gone: revision 1's last vote taken
    for a pick on revision 2 that is no vote."""
    room = room_with(tmp_path)
    room.deliver([answer("$a1", ANA, T0 + 1000, "main"), answer("$b1", BO, T0 + 2000, "main")])
    decided = room.record()
    assert decided["state"] == "answered" and decided["decided_by"] == [ANA, BO]
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 3000) / 1000)
    second = _revise(room, deadlines)
    assert room.record() == decided
    room.deliver([_vote_on(second, "$a2", ANA, T0 + 4000, "main")])
    assert room.record()["state"] == "pending" and room.record()["q_rev"] == 2
    room.deliver([redact("$r2", ANA, T0 + 5000, "$a2")])
    again = room.record()
    assert ({k: v for k, v in again.items() if k not in ("rev", "updated")}
            == {k: v for k, v in decided.items() if k not in ("rev", "updated")}), again


def test_a_withdrawal_with_a_reason_reads_without_brackets_in_brackets():
    # "Closed: no longer accepting answers (withdrawn (Dropped from 2.4))."
    from bridge.protocol.judge import closed_refusal
    from bridge.protocol.question_event import closed_replacement
    from bridge.protocol.recorded import RecordedQuestion

    content = posted()
    shown = closed_replacement("$q", content, "withdrawn (Dropped from 2.4)")["m.new_content"]["body"]
    assert shown.endswith("Closed: no longer accepting answers (withdrawn: Dropped from 2.4)."), shown
    question = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="s", content=content, open=False,
                                closed_why="withdrawn (Dropped from 2.4)")
    assert closed_refusal(question).message.startswith("This question is no longer open (withdrawn: Dropped from 2.4)")


def test_a_lone_vote_stays_a_pending_approval_when_the_next_revision_asks_without_one(tmp_path):
    """Revision 1 needs two votes and has Ana's; revision 2 is asked without
    the approval's fields and nobody has answered it: answers.json showed
    Ana's vote as the question's plain answer, "answered" ("an approval ...
    is never consent" without its quorum)."""
    room = room_with(tmp_path, expires="1h")
    room.deliver([answer("$a1", ANA, T0 + 1000, "main")])
    deadlines = Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: (T0 + 3000) / 1000)
    _revise(room, deadlines, "quorum", "expires", "answerers", "escalate")
    # The agent deletes answers.json while the bridge is down: the start writes it again, whole.
    (room.set_dir / "answers.json").unlink()
    room.pipeline.rewrite_missing()
    record = room.record()
    assert (record["state"], record["q_rev"], record["required"]) == ("pending", 1, 2), record
    assert [vote["sender"] for vote in record["votes"]] == [ANA] and "choice" not in record


def test_a_handing_over_the_homeserver_failed_is_handed_over_again_by_the_pass(tmp_path):
    """The homeserver answered the posting's first delayed event with a 503:
    nothing was handed over then or ever, and with the bridge down at the
    deadline the question stayed open in everyone's client."""
    from bridge.service.transport.matrix import MatrixError

    hs = Delaying()
    handed, failures = hs.send_delayed, [1]

    async def failing_once(room_id, event_type, content, txn, delay_ms):
        if failures[0]:
            failures[0] -= 1
            raise MatrixError(f"scheduling {event_type} in {room_id}", "HTTP 503")
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = failing_once
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    assert hs.delayed == {}
    clock[0] = T0 + 2000
    asyncio.run(deadlines.pass_once())
    assert hs.delayed == {}  # not tried again at once
    assert asyncio.run(deadlines.sweep()) == 0
    clock[0] = T0 + 7000
    asyncio.run(deadlines.pass_once())
    kinds = sorted(kind for kind, _content, _delay in hs.delayed.values())
    assert kinds == ["m.room.message", "org.matrix.msc3381.poll.end"], hs.delayed
    assert [delay for _kind, _content, delay in hs.delayed.values()] == [38_000, 38_000]
    clock[0] = T0 + 9000
    asyncio.run(deadlines.pass_once())
    assert len(hs.delayed) == 2 and hs.taken == 2  # handed over once


def test_a_closing_edit_too_late_to_restate_is_cancelled_before_the_bridge_says_its_own(tmp_path):
    """A vote in the deadline's last second is not restated to the
    homeserver; at the deadline the bridge sent its own closing edit but left
    the homeserver's "no votes" one scheduled: a pass a moment before the
    homeserver fired it let that stale edit land last, and stand."""
    room, deadlines, clock = scheduled(tmp_path, Delaying(), expires="45s")
    hs = room.pipeline.transport
    room.deliver([answer("$a1", ANA, T0 + 44_500, "main")])
    clock[0] = T0 + 44_600
    asyncio.run(deadlines.pass_once())  # too late to restate
    assert hs.closing_edits() == [("Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: "
                                   "no votes).", 44_000)]
    clock[0] = T0 + 45_000
    asyncio.run(deadlines.pass_once())  # the bridge's clock reaches the deadline before the homeserver fires
    assert hs.closing_edits() == []  # the stale one cancelled
    (own,) = [c for c in hs.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert "1 of the 2 votes needed" in _closed_lines(own)[-1]


def test_a_questions_people_outside_the_bridges_answerers_are_a_warning(tmp_path):
    """escalate.to names Cy, whom the bridge's own answerers leave out: the
    escalation told him "you may answer it now", and his answer was refused
    sender_not_allowed.  Lint said nothing (the quorum could still be met)."""
    from bridge.agents.sets import AgentSets

    raw = approval_set(quorum={"required": 2}, answerers=[ANA, BO], escalate={"after": "1h", "to": [CY]})
    asked = AgentSets(tmp_path / "ask", answerers=[ANA, BO]).ask("planner", "kinds", raw)
    said = [(w["where"], w["message"]) for w in asked.warnings]
    assert [m for w, m in said if w.endswith(".escalate.to")] == [
        f"{CY} is not among the bridge's answerers: named here, but every answer of theirs would be refused"], said
    assert [m for w, m in said if w.endswith(".answerers")] == [], said


class CancelRefusedOnce(Delaying):
    """Its first cancel of each delayed event is refused (Synapse's rate limit)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[str] = set()

    async def cancel_delayed(self, delay_id: str) -> bool:
        if delay_id not in self.refused:
            self.refused.add(delay_id)
            raise RuntimeError("429: too many requests")
        return await super().cancel_delayed(delay_id)


@pytest.mark.parametrize("fired", [False, True], ids=["cancelled-later", "sent-meanwhile"])
def test_a_decision_whose_cancels_were_refused_cancels_them_later_and_the_room_keeps_the_decision(tmp_path, fired):
    """Decided; the cancels of the delayed poll end and closing edit were
    refused.  They were tried again only at the next start, so the deadline's
    "expired undecided" edit went out over the decided question, while
    answers.json said answered."""
    hs = CancelRefusedOnce()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    room.deliver([answer("$a1", ANA, T0 + 2000, "main"), answer("$b1", BO, T0 + 4000, "main")])
    clock[0] = T0 + 5000
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered" and hs.delayed  # told; the cancels refused
    if fired:
        for delay_id in list(hs.delayed):
            hs.fire(delay_id)  # the deadline comes before the next pass
    clock[0] = T0 + 10_000
    asyncio.run(deadlines.pass_once())
    assert hs.delayed == {}
    edits = [c["m.new_content"]["body"] for c in hs.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert "expired undecided" not in edits[-1] and "decided" in edits[-1].rsplit("\n", 1)[-1], edits[-1]
    asyncio.run(deadlines.pass_once())
    assert len([c for c in hs.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]) == len(edits)


def test_a_not_sure_alone_on_an_approval_leaves_the_homeservers_closing_edit_saying_undecided(tmp_path):
    """Ana's "not sure" is no vote: with the bridge down at the deadline the
    homeserver's closing edit read "closed at its deadline" (an answer that
    stands), and the approval had expired undecided."""
    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    room.deliver([answer("$a1", ANA, T0 + 2000, "unsure")])
    clock[0] = T0 + 3000
    asyncio.run(deadlines.pass_once())
    assert [words for words, _delay in hs.closing_edits()] == [
        "Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: no votes)."]


def test_an_escalation_on_another_day_says_its_date_as_the_deadline_does_and_keeps_it_once_closed():
    """escalate.after "2d": the line said "Undecided by 08:00 UTC", today's
    time, two days early, beside a deadline line that named its date."""
    from bridge.protocol.question_event import closed_replacement

    content = posted(expires="3d", escalate={"after": "2d", "to": [DEE]}, **APPROVAL)
    body = content["body"]
    assert "Answer by Mon 18 Jan 2027, 08:00 UTC." in body.split("\n")
    assert f"Undecided by Sun 17 Jan 2027, 08:00 UTC: {DEE} will be asked too." in body
    late = closed_replacement("$q", content, "expired undecided at 08:00 UTC: no votes", T0 + 3 * 86_400_000)
    assert f"Undecided by Sun 17 Jan 2027, 08:00 UTC: {DEE} was asked too." in _closed_lines(late)
    early = closed_replacement("$q", content, "decided", T0 + 86_400_000)
    assert not any(DEE in line for line in _closed_lines(early))


def test_a_question_open_again_no_longer_offers_its_ended_poll():
    """Decided, then undone: the poll stays ended, and the message open
    again still said "To answer: vote in the poll", which Element no longer lets anyone do."""
    from bridge.protocol.question_event import reopened_replacement

    content = posted(**APPROVAL)
    assert "To answer: vote in the poll; reply" in content["body"]
    again = reopened_replacement("$q", content, "undecided again: 1 of the 2 votes needed")["m.new_content"]
    assert "vote in the poll" not in again["body"] and "To answer: reply to this message" in again["body"]
    assert "vote in the poll" not in again["formatted_body"] and "<em>To answer:</em> reply" in again["formatted_body"]
    assert again["body"].endswith("Undecided again: 1 of the 2 votes needed.")


def test_a_question_open_again_says_its_deadline_and_the_escalation_as_of_the_undo():
    """Posted at 08:00 (by a bridge that said the time left), decided, undone
    at 09:45: the message open again still said "in 2 hours" and that @dee
    "will be asked too" at 09:00, both as posted, with 15 minutes left and
    @dee asked at the undo.  It says the deadline as a time, and @dee asked."""
    from bridge.protocol.question_event import reopened_replacement

    content = posted_before(posted(expires="2h", escalate={"after": "1h", "to": [DEE]}, **APPROVAL))
    assert "Answer by 10:00 UTC, in 2 hours." in content["body"].split("\n")
    again = reopened_replacement("$q", content, "undecided again: 1 of the 2 votes needed",
                                 T0 + 105 * 60_000)["m.new_content"]
    lines = again["body"].split("\n")
    assert "Answer by 10:00 UTC." in lines and not any("in 2 hours" in line for line in lines)
    assert f"Undecided by 09:00 UTC: {DEE} was asked too." in lines
    assert "<em>Answer by 10:00 UTC.</em>" in again["formatted_body"] and "was asked too" in again["formatted_body"]
    assert "in 2 hours" not in again["formatted_body"] and "will be asked" not in again["formatted_body"]
    early = reopened_replacement("$q", content, "undecided again", T0 + 30 * 60_000)["m.new_content"]["body"]
    assert "Answer by 10:00 UTC." in early.split("\n")
    assert f"Undecided by 09:00 UTC: {DEE} will be asked too." in early.split("\n")


def test_an_edit_redacted_while_it_waited_for_its_original_still_stood_until_the_redaction(tmp_path):
    """Ana's edit to the veto came before her original answer, and its
    redaction came before the original too: the waiting edit was dropped, and
    the veto that stood from the edit to the redaction, deciding the
    approval then, was lost (pending, as if never sent).  Found by
    test_approvals_model."""
    room = room_with(tmp_path)
    room.deliver([answer("$e1", ANA, T0 + 2, "main"), edit("$e2", ANA, T0 + 3, "$e0", "stable")])
    room.deliver([redact("$e3", ANA, T0 + 4, "$e2"), answer("$e0", ANA, T0 + 1, "main")])
    record = room.record()
    assert (record["state"], record["choice"], record["decided_by"]) == ("answered", "stable", [ANA])
    assert room.verify() == []
    outcomes = [(o, e) for o, e in room.store.db.execute(
        "SELECT outcome, event_id FROM answer_log ORDER BY seq").fetchall()]
    assert ("accepted", "$e2") in outcomes and ("withdrawn", "$e3") in outcomes


def test_a_plain_answers_edit_redacted_while_it_waited_leaves_the_later_answer_standing(tmp_path):
    room = Room(tmp_path, posted_ms=T0)
    room.deliver([answer("$e1", ANA, T0 + 2, "main"), edit("$e2", ANA, T0 + 3, "$e0", "stable")])
    room.deliver([redact("$e3", ANA, T0 + 4, "$e2"), answer("$e0", ANA, T0 + 1, "main")])
    assert (room.record()["state"], room.record()["choice"]) == ("answered", "main")
    assert room.record()["source"]["event_id"] == "$e1"


# -- a decision undone: what it handed to the homeserver again ------------------------------

def _mentions_of(contents: Any, who: str) -> list[dict[str, Any]]:
    return [c for c in contents if c.get("m.mentions", {}).get("user_ids") == [who]]


def _edits_sent(hs: Delaying) -> list[str]:
    """The closing lines of the question's edits the room has seen, in order."""
    return [c["m.new_content"]["body"].rsplit("\n", 1)[-1] for c in hs.sent
            if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]


def _decided_then_undone(tmp_path: Path, hs: Delaying, **fields: Any) -> tuple[Room, Deadlines, list[int]]:
    """Ana and Bo decide it at 5 s; Ana's vote, taken back before Bo's, is
    read at 6 s: the decision is undone and the question open to votes again."""
    room, deadlines, clock = scheduled(tmp_path, hs, **fields)
    room.deliver([answer("$a1", ANA, T0 + 2000, "main"), answer("$b1", BO, T0 + 4000, "main")])
    clock[0] = hs.now_ms = T0 + 5000
    asyncio.run(deadlines.pass_once())
    room.deliver([redact("$a1-gone", ANA, T0 + 3000, "$a1")])
    clock[0] = hs.now_ms = T0 + 6000
    asyncio.run(deadlines.pass_once())
    return room, deadlines, clock


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "encrypted"])
def test_a_restart_after_a_decision_undone_keeps_its_closing_edit_and_escalation_scheduled(tmp_path, sealed):
    """Undone, the closing edit and the escalation were handed to the
    homeserver again; the sweep at the next start (or leader takeover) took
    them for strays, the store still saying "closed as decided", and
    cancelled both while the store kept their delay ids: the moderator was
    never called in, and at the deadline the bridge left the closing to the
    cancelled edit, so the message read "undecided again" for good."""
    hs = Delaying()
    hs.sealed = sealed
    room, _deadlines, clock = _decided_then_undone(tmp_path, hs, expires="45s", escalate={"after": "30s", "to": [DEE]})
    closed = ("Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: "
              f"1 of the 2 votes needed (\u201cThe main branch\u201d: {BO})).")
    assert hs.closing_edits() == [(closed, 39_000)]
    restarted = Deadlines(room.store, hs, flush=room.pipeline.flush, clock=lambda: clock[0] / 1000)
    asyncio.run(restarted.pass_once())
    assert asyncio.run(restarted.sweep()) == 0
    assert hs.closing_edits() == [(closed, 39_000)]
    (escalation,) = [d for d, (_k, c, _delay) in hs.delayed.items() if _mentions_of([c], DEE)]
    clock[0] = T0 + 30_000
    hs.fire(escalation)  # the homeserver calls the moderator in on time
    for ms in (T0 + 31_000, T0 + 32_000):
        clock[0] = ms
        asyncio.run(restarted.pass_once())
    assert len(_mentions_of(hs.sent, DEE)) == 1  # once: the bridge does not call them in again
    clock[0] = T0 + 45_000
    (edit,) = [d for d, (_k, c, _delay) in hs.delayed.items() if c.get("m.relates_to", {}).get("rel_type")]
    hs.fire(edit)  # the homeserver closes it at the deadline
    clock[0] = T0 + 46_000
    asyncio.run(restarted.pass_once())
    assert room.record()["state"] == "expired" and _edits_sent(hs)[-1] == closed
    notices = [c["body"] for c in hs.sent if c.get("msgtype") == "m.notice"]
    assert notices[-1].startswith("This question expired undecided at 08:00:45 UTC"), notices[-1]
    assert hs.delayed == {}


def test_a_handing_over_refused_at_the_undo_is_handed_over_again_by_the_pass(tmp_path):
    """The homeserver refused (a 429) the closing edit and escalation the
    undo handed over again: owed, but the pass tried owed handings over
    only for an open question, never for one open again, so with the bridge
    down the moderator was never called in and the deadline closed nothing."""
    from bridge.service.transport.matrix import MatrixError

    hs = Delaying()
    handed = hs.send_delayed
    refusing = [True]

    async def refused_at_the_undo(room_id, event_type, content, txn, delay_ms):
        if refusing[0] and hs.taken >= 3:  # the posting's three went through; what the undo hands over, not
            raise MatrixError(f"scheduling {event_type} in {room_id}", "HTTP 429")
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = refused_at_the_undo
    room, deadlines, clock = _decided_then_undone(tmp_path, hs, expires="45s", escalate={"after": "30s", "to": [DEE]})
    assert any(c.get("body", "").startswith("The decision is undone") for c in hs.sent)
    assert hs.delayed == {}  # refused
    refusing[0] = False
    clock[0] = T0 + 7000
    asyncio.run(deadlines.pass_once())
    assert hs.delayed == {}  # not tried again at once
    clock[0] = T0 + 12_000
    asyncio.run(deadlines.pass_once())
    closed = ("Closed: no longer accepting answers (expired undecided at 08:00:45 UTC: "
              f"1 of the 2 votes needed (\u201cThe main branch\u201d: {BO})).")
    assert hs.closing_edits() == [(closed, 33_000)]
    assert [delay for _k, c, delay in hs.delayed.values() if _mentions_of([c], DEE)] == [18_000]
    clock[0] = T0 + 13_000
    asyncio.run(deadlines.pass_once())
    assert len(hs.delayed) == 2 and hs.taken == 5  # handed over once (after the posting's three)
    assert asyncio.run(deadlines.sweep()) == 0  # and held, not taken for strays


@pytest.mark.parametrize("taken", [True, False], ids=["taken-without-a-word", "not-taken"])
def test_a_handing_over_owed_when_the_question_is_decided_leaves_nothing_scheduled(tmp_path, taken):
    """The closing edit's handing over at posting got a 502 (a proxy timed
    out) though the homeserver took it: owed, its delay id never learnt.
    Decided before the pass's retry learnt it, the decision cancelled what
    the store knew (the poll end) and the "expired undecided: no votes" edit
    went out at the deadline over the decided question."""
    from bridge.service.transport.matrix import MatrixError

    hs = Delaying()
    handed = hs.send_delayed

    async def edit_timed_out(room_id, event_type, content, txn, delay_ms):
        if content.get("m.relates_to", {}).get("rel_type") == "m.replace":
            if taken:
                await handed(room_id, event_type, content, txn, delay_ms)
            raise MatrixError(f"scheduling {event_type} in {room_id}", "HTTP 502")
        return await handed(room_id, event_type, content, txn, delay_ms)

    hs.send_delayed = edit_timed_out
    room, deadlines, clock = scheduled(tmp_path, hs, expires="1h")
    hs.send_delayed = handed
    assert len(hs.closing_edits()) == (1 if taken else 0)
    room.deliver([answer("$a1", ANA, T0 + 2000, "main"), answer("$b1", BO, T0 + 3000, "main")])
    clock[0] = T0 + 4000  # before the owed one's wait is out
    asyncio.run(deadlines.pass_once())
    assert room.record()["state"] == "answered"
    assert hs.delayed == {}  # nothing left to go out at the deadline
    assert "decided" in _edits_sent(hs)[-1]
    for ms in range(T0 + 5000, T0 + 12_000, 1000):
        clock[0] = ms
        asyncio.run(deadlines.pass_once())
    assert hs.delayed == {}  # (one the homeserver never took: scheduled by the look-up, and cancelled)
    assert not taken or hs.taken == 2  # looked up, never handed over again
    assert room.store.get_meta("delays_owed:$q") is None


@pytest.mark.parametrize("fired", [True, False], ids=["deadline-edit-went-out", "cancelled-in-time"])
def test_a_question_withdrawn_just_before_its_deadline_reads_withdrawn_not_expired(tmp_path, fired):
    """The agent withdrew the question half a second before its deadline:
    the poster edited it "withdrawn", but the pass cancels the delayed
    events up to a tick later, and the homeserver's "expired undecided: no
    votes" edit went out in between and stood as the question's last word.
    The pass heard the cancel answer "sent already" and said nothing."""
    from bridge.protocol.question_event import closed_replacement

    hs = Delaying()
    room, deadlines, clock = scheduled(tmp_path, hs, expires="45s")
    why = "withdrawn (by the agent)"
    clock[0] = T0 + 44_500
    with room.store.transaction():  # the poster closes it, then edits its message to say so
        room.store.close_question("$q", why)
    withdrawn = closed_replacement("$q", room.posted.content, why, room.store.closed_at("$q"))
    asyncio.run(hs.send(ROOM, "m.room.message", withdrawn, "close-edit"))
    if fired:
        for delay_id in list(hs.delayed):
            hs.fire(delay_id)  # the deadline, before the next pass
        assert "expired undecided" in _edits_sent(hs)[-1]
    clock[0] = T0 + 45_500
    asyncio.run(deadlines.pass_once())
    assert hs.delayed == {}
    assert _edits_sent(hs)[-1] == "Closed: no longer accepting answers (withdrawn: by the agent)."
    assert hs.sent[-1]["m.new_content"] == withdrawn["m.new_content"]  # the poster's words, said again
    edits = len(_edits_sent(hs))
    assert edits == (3 if fired else 1)
    asyncio.run(deadlines.pass_once())
    assert len(_edits_sent(hs)) == edits  # once


def test_a_decision_undone_by_a_change_of_mind_read_late_is_accepted_by_verify(tmp_path):
    """Carol voted main, then said "not sure"; Alice voted main after that.
    Read in the order main, Alice's main, then Carol's "not sure" (late),
    the decision logged between is undone, and the record is pending: what
    the room says.  ``verify`` refused that record (pending while the log's
    latest word was the decision), as if only a vote taken back could undo
    one.  (Found by the approvals model, on a clean clone's run.)"""
    room = room_with(tmp_path)
    room.deliver([answer("$e0", CY, T0 + 1, "main"), answer("$e5", ANA, T0 + 6, "main")])
    assert room.record()["decided_by"] == [CY, ANA]
    room.deliver([answer("$e1", CY, T0 + 2, "unsure")])
    assert room.record()["state"] == "pending"
    assert room.verify() == []
