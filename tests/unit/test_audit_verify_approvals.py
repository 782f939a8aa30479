"""verify reads an approval's record as a tally from what the log holds, not
only from what the editable files say (PROTOCOL 2a: an expired approval is
never consent, whatever votes it had)."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_audit_log_store import tamper

pytestmark = pytest.mark.usefixtures("store_backend")

T0 = 1_800_000_000_000
APPROVAL = {"quorum": {"required": 2, "veto": []}, "expires": "45s"}


def _pass_deadlines(room, ms: int) -> None:
    from bridge.service.answering.deadlines import Deadlines

    with room.store.transaction():  # what posting does
        room.store.set_meta("approval:$q", "1")
    asyncio.run(Deadlines(room.store, room.pipeline.transport, flush=room.pipeline.flush,
                          clock=lambda: ms / 1000).pass_once())


def _as_answer(record: dict, **more) -> None:
    """The approval's record rewritten as its one vote's plain answer (the
    vote's receipt kept: a vote's leaf hashes exactly that answer)."""
    record.update(state="answered", choice=record["votes"][0]["choice"], **more)
    for key in ("votes", "required", "expired_at"):
        record.pop(key, None)


def test_an_expired_approval_rewritten_as_its_one_votes_answer_is_named_from_the_log_alone(tmp_path):
    """With no questions.json in the folder (or one whose quorum was taken
    out), nothing but the log says the question was an approval, and the
    log's expiry leaf says so: the record is read as a tally, and the expiry
    leaf is named.  verify said all holds."""
    from helpers.sets import all_kinds_set
    from helpers.timeline import PEOPLE, Room, answer

    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    room.deliver([answer("$a1", PEOPLE[0], T0 + 1000, "main")])
    _pass_deadlines(room, T0 + 46_000)
    assert room.record()["state"] == "expired" and room.verify() == []
    assert not (room.set_dir / "questions.json").exists()
    named = ["record 'branch' (leaf 0): the record says answered, and the log's latest word on the question is its "
             "expiry (leaf 1): an expired approval is never consent"]
    assert tamper(room, _as_answer) == named
    assert tamper(room, lambda r: _as_answer(r, decided_by=[PEOPLE[0]])) == named
    asked = all_kinds_set("kinds")  # the question as asked, its quorum taken out
    next(q for q in asked["questions"] if q["id"] == "branch").update(expires="45s")
    (room.set_dir / "questions.json").write_text(json.dumps(asked))
    assert tamper(room, _as_answer) == named


def test_an_answer_read_late_to_a_deadline_with_no_quorum_still_stands_after_its_expiry(tmp_path):
    """A question with a deadline and no quorum expires unanswered (the log
    says expired), then an answer sent before the deadline is read: it
    stands, and the bridge logs no outcome for that.  The expiry's leaf
    names no quorum, so the record is still one person's answer."""
    from helpers.timeline import PEOPLE, Room, answer

    room = Room(tmp_path, approval={"expires": "45s"}, posted_ms=T0)
    _pass_deadlines(room, T0 + 46_000)
    assert room.record()["state"] == "expired" and room.verify() == []
    room.deliver([answer("$a1", PEOPLE[0], T0 + 44_000, "main")])  # sent before the deadline, read after it
    _pass_deadlines(room, T0 + 47_000)
    record = room.record()
    assert (record["state"], record["choice"]) == ("answered", "main")
    outcomes = [json.loads(leaf)["outcome"] for _i, leaf in room.store.audit.leaves(0, room.store.audit.size())]
    assert outcomes[-1] == "accepted" and "expired" in outcomes
    assert room.verify() == []


def test_an_expired_approval_asked_again_with_no_quorum_is_answered_by_one_person(tmp_path):
    """The expiry of revision 1 makes revision 1's record a tally; the agent
    asks again as revision 2, a plain question, and one person answers it.
    Their answer names its revision (its hash holds ``q_rev``), which is
    after the one that expired: the record is that answer, not a tally."""
    from bridge.protocol.question_event import build_question_event
    from bridge.protocol.recorded import RecordedQuestion
    from bridge.questionset.model import QuestionSet
    from helpers.sets import all_kinds_set
    from helpers.timeline import PEOPLE, ROOM, Room, answer

    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    room.deliver([answer("$a1", PEOPLE[0], T0 + 1000, "main")])
    _pass_deadlines(room, T0 + 46_000)
    assert room.record()["state"] == "expired"
    raw = all_kinds_set("kinds")
    next(q for q in raw["questions"] if q["id"] == "branch")["rev"] = 2
    qset = QuestionSet.model_validate(raw)
    content = build_question_event(qset, next(q for q in qset.questions if q.id == "branch"),
                                   elicitation_id="elc_branch2", posted_ms=T0 + 60_000)
    with room.store.transaction():
        room.store.close_question("$q", "replaced by revision 2")
        room.store.record_posted(RecordedQuestion(event_id="$q2", room_id=ROOM, set_id="kinds", content=content),
                                 set_dir=str(room.set_dir), posted_at=2)
    again = answer("$b1", PEOPLE[1], T0 + 61_000, "stable")
    again["content"].update(elicitation_id="elc_branch2", **{"m.relates_to": {"rel_type": "m.reference",
                                                                              "event_id": "$q2"}})
    room.deliver([again])
    record = room.record()
    assert (record["state"], record["choice"], record["q_rev"]) == ("answered", "stable", 2)
    assert "votes" not in record
    assert room.verify() == []


def test_a_pending_approval_rewritten_as_its_one_votes_answer_is_named_from_the_log_alone(tmp_path):
    """A vote's leaf hashes exactly what one person's answer would, and the
    question it answered is only a hash there: with questions.json gone or
    its quorum taken out, a pending approval rewritten as its one vote's
    answer matched that leaf, and verify said all holds.  The vote's leaf
    now carries the quorum its question was posted with."""
    from helpers.sets import all_kinds_set
    from helpers.timeline import PEOPLE, Room, answer

    room = Room(tmp_path, approval={"quorum": {"required": 2, "veto": ["stable"]}}, posted_ms=T0)
    room.deliver([answer("$a1", PEOPLE[0], T0 + 1000, "main")])
    assert room.record()["state"] == "pending" and room.verify() == []
    named = ["record 'branch' (leaf 0): the record says decided, and names no one who decided it"]
    assert not (room.set_dir / "questions.json").exists()
    assert tamper(room, _as_answer) == named
    asked = all_kinds_set("kinds")  # the question as asked, its quorum taken out
    (room.set_dir / "questions.json").write_text(json.dumps(asked))
    assert tamper(room, _as_answer) == named
    # and the honest record still holds, though questions.json says no quorum now
    assert room.verify() == []


def test_only_an_approvals_leaves_carry_its_quorum_and_every_other_leaf_is_as_it_was():
    """The quorum is in the leaf's ``question`` object only where the posted
    question had one: every other leaf keeps the fields (and so the bytes and
    the hash) it always had, and a leaf that carries it is still version 1."""
    from bridge.protocol import audit_leaf

    def leaf(question: dict) -> dict:
        return audit_leaf.build_leaf(outcome="accepted", set_id="s", room_id="!r", event_id="$e", sender="@p:hs",
                                     ts=1, question={"question": question}, question_event_id="$q",
                                     record={"qid": "q", "state": "answered", "choice": "yes", "q_rev": 1})

    plain = leaf({"id": "q", "rev": 1, "expires": "2026-01-01T00:00:00Z"})
    assert sorted(plain["question"]) == ["content_sha256", "event_id", "id", "rev"]
    approval = leaf({"id": "q", "rev": 1, "quorum": {"required": 2, "veto": ["no"]}})
    assert approval["question"]["quorum"] == {"required": 2, "veto": ["no"]}
    assert audit_leaf.parse_leaf(audit_leaf.canonical(approval)) == approval
    # what the bridge does not count as a quorum is not logged as one
    for odd in ({"required": 0}, {"required": True}, {"veto": ["no"]}, "2"):
        assert "quorum" not in leaf({"id": "q", "rev": 1, "quorum": odd})["question"]
