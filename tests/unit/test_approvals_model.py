"""Model-based: whatever the people permitted (and a stranger) do to a 2-of-3
approval with a veto and a deadline — votes by answer and in the poll, edits,
redactions (their own and a moderator's), emptied poll votes — delivered in
any order, some held for their keys a while, with restarts and the
bridge's deadlines pass at random times, answers.json says what a reference
computed from the room's timeline alone says: pending with the standing votes,
decided by the first quorum or veto in the room's order, or expired; and
after every step ``verify`` accepts the record against the answer log."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from bridge.service.answering.deadlines import Deadlines
from helpers.timeline import DEVICE, MODERATOR, Room, answer, edit, redact, vote

ANA, BO, CY, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@eve:hs"
PERMITTED = (ANA, BO, CY)
T0 = 1_800_000_000_000
EXPIRES = T0 + 45_000  # "45s" from the posting
APPROVAL = {"answerers": list(PERMITTED), "quorum": {"required": 2, "veto": ["stable"]}, "expires": "45s"}
PICKS = ("main", "stable", "unsure")
LAST = 2**61  # after every event; a cast never withdrawn is withdrawn at 2**62


def reference(events: list[dict[str, Any]], expired: bool, order: dict[str, int]) -> tuple[Any, ...]:
    """(state, choice, decided_by, votes) from the events delivered, in the
    room's order; ``order``: when each reached the bridge (a held one: when
    it came, sealed; the bridge held what it said from then on)."""
    by_id = {e["id"]: e for e in events}

    def counts(redaction: dict[str, Any], e: dict[str, Any]) -> bool:
        return redaction["kind"] == "redact" and redaction["sender"] in (e["sender"], MODERATOR)

    def stripped(e: dict[str, Any]) -> bool:
        # A redaction read before its target: the target arrives with its content
        # stripped (as Matrix serves a redacted event), so what it said is unknowable.
        # So is an edit read after the redaction of what it edits (which takes its edits with it).
        hidden = (e["id"], e["target"]) if e["kind"] == "edit" else (e["id"],)
        return any(counts(r, e) and r["target"] in hidden and order[r["id"]] < order[e["id"]] for r in events)

    judged = [e for e in events if e["sender"] in PERMITTED and e["ts"] < EXPIRES and not stripped(e)]
    casts = [e for e in judged if e["kind"] in ("answer", "vote")
             or (e["kind"] == "edit" and e["target"] in by_id and by_id[e["target"]]["sender"] == e["sender"]
                 and by_id[e["target"]] in judged)]

    def withdrawn_at(cast: dict[str, Any]) -> int:
        root = cast["target"] if cast["kind"] == "edit" else cast["id"]
        times = [e["ts"] for e in events if counts(e, cast) and e["target"] in (cast["id"], root)]
        if cast["kind"] == "vote":
            times += [e["ts"] for e in events if e["kind"] == "clear" and e["sender"] == cast["sender"]
                      and e["ts"] >= cast["ts"]]
        return min(times, default=2**62)

    gone = {c["id"]: withdrawn_at(c) for c in casts}

    def standing(at: int) -> dict[str, dict[str, Any]]:
        now: dict[str, dict[str, Any]] = {}
        for cast in sorted(casts, key=lambda c: c["ts"]):
            if cast["ts"] <= at and gone[cast["id"]] > at:
                now[cast["sender"]] = cast
        return now

    def votes(now: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
        return [(c["sender"], c["option"], c["id"]) for c in sorted(now.values(), key=lambda c: c["ts"])
                if c["option"] != "unsure"]

    points = sorted({c["ts"] for c in casts} | {t for t in gone.values() if t < 2**62})
    for point in points:
        if point >= EXPIRES:
            break
        now = standing(point)
        step = next((c for c in casts if c["ts"] == point), None)
        if step is not None and now.get(step["sender"]) is step and step["option"] == "stable":
            return "answered", "stable", [step["sender"]], votes(standing(LAST))
        main = [c for c in now.values() if c["option"] == "main"]
        if len(main) >= 2:
            return ("answered", "main", [c["sender"] for c in sorted(main, key=lambda c: c["ts"])],
                    votes(standing(LAST)))
    final = votes(standing(LAST))
    if expired:
        return "expired", None, None, votes(standing(EXPIRES - 1))  # what stood at the deadline
    return ("pending" if final else None), None, None, final


class ApprovalTimeline(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp())
        self.room = Room(self.tmp, approval=APPROVAL, posted_ms=T0)
        with self.room.store.transaction():
            self.room.store.set_meta("approval:$q", "1")
        self.timeline: list[dict[str, Any]] = []  # in the room's order
        self.undelivered: list[dict[str, Any]] = []
        self.delivered: list[dict[str, Any]] = []
        self.held: list[dict[str, Any]] = []  # come sealed, waiting for their keys
        self.arrived: dict[str, int] = {}  # event id -> when it reached the bridge
        self.ts = T0
        self.clock = T0
        self.expired = False

    def teardown(self) -> None:
        self.room.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _add(self, kind: str, sender: str, gap: int, **fields: Any) -> None:
        self.ts += gap
        event = {"id": f"$e{len(self.timeline)}", "kind": kind, "sender": sender, "ts": self.ts, **fields}
        self.timeline.append(event)
        self.undelivered.append(event)

    @rule(sender=st.sampled_from((*PERMITTED, EVE)), option=st.sampled_from(PICKS), gap=st.integers(1, 9000))
    def answer(self, sender: str, option: str, gap: int) -> None:
        self._add("answer", sender, gap, option=option)

    @rule(sender=st.sampled_from(PERMITTED), option=st.sampled_from(("main", "stable")), gap=st.integers(1, 9000))
    def poll_vote(self, sender: str, option: str, gap: int) -> None:
        self._add("vote", sender, gap, option=option)

    @rule(sender=st.sampled_from(PERMITTED), gap=st.integers(1, 9000))
    def poll_clear(self, sender: str, gap: int) -> None:
        self._add("clear", sender, gap)

    @rule(data=st.data(), option=st.sampled_from(PICKS), gap=st.integers(1, 9000))
    def edit(self, data: st.DataObject, option: str, gap: int) -> None:
        answers = [e for e in self.timeline if e["kind"] == "answer"]
        if answers:
            target = data.draw(st.sampled_from(answers))
            self._add("edit", target["sender"], gap, option=option, target=target["id"])

    @rule(data=st.data(), gap=st.integers(1, 9000), moderator=st.booleans())
    def redact(self, data: st.DataObject, gap: int, moderator: bool) -> None:
        mine = [e for e in self.timeline if e["kind"] in ("answer", "vote", "edit")]
        if mine:
            target = data.draw(st.sampled_from(mine))
            self._add("redact", MODERATOR if moderator else target["sender"], gap, target=target["id"])

    def _arrive(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.undelivered.remove(event)
            self.arrived[event["id"]] = len(self.arrived)

    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        """A vote or an answer comes sealed: held until its keys come (one
        whose redaction came first comes stripped, with nothing to decrypt)."""
        redacted = {e["target"] for e in self.delivered if e["kind"] == "redact"}
        sealed = [e for e in self.undelivered if e["kind"] in ("answer", "vote") and e["id"] not in redacted]
        if sealed:
            event = data.draw(st.sampled_from(sealed))
            self._arrive([event])
            self.held.append(event)
            self.room.hold(_event(event))

    @rule()
    def keys_come(self) -> None:
        if self.held:
            self.delivered.extend(self.held)
            self.room.release([_event(e) for e in self.held])
            self.held = []

    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """Some of what is in the room reaches the bridge, in any order."""
        if not self.undelivered:
            return
        batch = data.draw(st.lists(st.sampled_from(self.undelivered), min_size=1, max_size=4, unique_by=lambda e: e["id"]))
        self._arrive(batch)
        self.delivered.extend(batch)
        self.room.deliver([_event(e) for e in batch])

    @rule()
    def restart(self) -> None:
        self.room.crash()

    @rule(seconds=st.integers(1, 60))
    def tick(self, seconds: int) -> None:
        """The bridge's deadlines pass, at a later time."""
        self.clock = max(self.clock, self.ts) + seconds * 1000
        if self.clock >= EXPIRES:
            self.expired = True
        clock = self.clock
        asyncio.run(Deadlines(self.room.store, self.room.pipeline.transport, flush=self.room.pipeline.flush,
                              clock=lambda: clock / 1000).pass_once())

    @invariant()
    def the_record_is_the_rooms(self) -> None:
        record = self.room.record()
        state, choice, decided_by, votes = reference(self.delivered, self.expired, self.arrived)
        if state is None:
            assert record is None or record["state"] not in ("pending", "expired") and not record.get("votes")
            return
        assert record is not None and record["state"] == state, (record, state)
        assert record.get("choice") == choice and record.get("decided_by") == decided_by
        assert [(v["sender"], v["choice"], v["event_id"]) for v in record["votes"]] == votes

    @invariant()
    def the_log_speaks_for_the_record(self) -> None:
        """Whatever state the record reached, and however: verify accepts it against the log's leaves."""
        assert self.room.verify() == []


def _event(e: dict[str, Any]) -> dict[str, Any]:
    if e["kind"] == "answer":
        return answer(e["id"], e["sender"], e["ts"], e["option"])
    if e["kind"] == "vote":
        return vote(e["id"], e["sender"], e["ts"], [e["option"]])
    if e["kind"] == "clear":
        return vote(e["id"], e["sender"], e["ts"], [])
    if e["kind"] == "edit":
        return edit(e["id"], e["sender"], e["ts"], e["target"], e["option"])
    return redact(e["id"], e["sender"], e["ts"], e["target"])


def test_a_moderators_redaction_read_before_the_vote_itself_withdraws_it_at_its_place(tmp_path: Path) -> None:
    """A moderator redacts Carol's poll vote, Alice answers, and Carol
    empties her votes later; the redaction and the emptying reach the bridge
    before the vote itself, which comes decrypted (judged, then withdrawn at
    the redaction's place).  Her vote stopped counting at the moderator's
    redaction, before Alice's answer: nothing was decided.  The redaction,
    kept while its target was unknown, stayed marked so when it was applied,
    and the tally counts a moderator's only where it withdrew: Carol's vote
    stood until her emptying, and decided with Alice's."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([redact("$rm", MODERATOR, T0 + 3, "$v")])
    room.deliver([vote("$cc", CY, T0 + 5, [])])
    room.deliver([answer("$a", ANA, T0 + 4, "main")])
    room.deliver([{**vote("$v", CY, T0 + 1, ["main"]), DEVICE: {"device_id": "PHONE", "cross_signed": True}}])
    record = room.record()
    assert record is not None and record["state"] == "pending", record
    assert [(v["sender"], v["event_id"]) for v in record["votes"]] == [(ANA, "$a")]
    assert "decided_by" not in record
    assert room.verify() == []
    room.store.close()


def test_a_vote_taken_back_twice_stops_counting_at_the_earlier(tmp_path: Path) -> None:
    """Carol's poll vote is emptied and later redacted; the redaction reaches
    the bridge first. Her vote stopped counting at the emptying, before Alice's
    answer, so nothing was decided (found by the machine above)."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([vote("$v", CY, T0 + 1, ["main"])])
    room.deliver([vote("$ca", ANA, T0 + 2, []), redact("$r", CY, T0 + 5, "$v")])
    room.deliver([vote("$cc", CY, T0 + 3, []), answer("$a", ANA, T0 + 4, "main")])
    record = room.record()
    assert record is not None and record["state"] == "pending", record
    assert [(v["sender"], v["event_id"]) for v in record["votes"]] == [(ANA, "$a")]
    assert "decided_by" not in record
    room.store.close()


def test_a_redaction_read_after_a_later_emptying_still_withdraws_at_its_place(tmp_path: Path) -> None:
    """Alice's poll vote is redacted, and later she empties her votes; the
    emptying reaches the bridge first, then the redaction with Bob's answer.
    Her vote stopped counting at the redaction, before Bob's answer, so
    nothing was decided (found by the machine above)."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([vote("$v", ANA, T0 + 1, ["main"])])
    room.deliver([vote("$c", ANA, T0 + 9, []), redact("$r", ANA, T0 + 2, "$v"), answer("$a", BO, T0 + 8, "main")])
    record = room.record()
    assert record is not None and record["state"] == "pending", record
    assert [(v["sender"], v["event_id"]) for v in record["votes"]] == [(BO, "$a")]
    assert "decided_by" not in record
    assert room.verify() == []
    room.store.close()


def test_an_earlier_emptying_read_late_counts_the_decision_again(tmp_path: Path) -> None:
    """Alice votes in the poll and empties her votes twice (the first emptying
    read last); Bob answers between the two, Alice answers after both. Read
    first, the later emptying left her vote standing at Bob's answer:
    decided by Alice and Bob. The earlier one, read late, stops her vote
    before Bob's answer: decided by Bob and Alice's answer. Her vote was
    withdrawn already, so nothing was counted again (found by the machine
    above, seed 11)."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([vote("$v", ANA, T0 + 1, ["main"])])
    room.deliver([answer("$b", BO, T0 + 6, "main"), answer("$a", ANA, T0 + 10, "main"), vote("$c2", ANA, T0 + 7, [])])
    assert room.record()["decided_by"] == [ANA, BO]
    room.deliver([vote("$c1", ANA, T0 + 2, [])])
    record = room.record()
    assert (record["state"], record["decided_by"]) == ("answered", [BO, ANA]), record
    assert [(v["sender"], v["event_id"]) for v in record["votes"]] == [(BO, "$b"), (ANA, "$a")]
    assert room.verify() == []
    room.store.close()


ApprovalTimeline.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_approval_record_is_the_rooms = ApprovalTimeline.TestCase


def test_a_veto_held_for_its_keys_and_taken_back_later_still_decided(tmp_path: Path) -> None:
    """Carol's veto waits for its keys; Alice and Bob approve after it, and
    Carol redacts her veto after that; then the keys come.  The veto stood
    from its place to the redaction's and decided at once: it was dropped
    unjudged, and the two approvals decided instead (found by a review)."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    veto = answer("$v", CY, T0 + 1, "stable")
    room.hold(veto)
    room.deliver([answer("$a", ANA, T0 + 2, "main"), answer("$b", BO, T0 + 3, "main")])
    room.deliver([redact("$r", CY, T0 + 4, "$v")])
    room.release([veto])
    record = room.record()
    assert record is not None and record["state"] == "answered", record
    assert record["choice"] == "stable" and record["decided_by"] == [CY]
    assert room.verify() == []
    room.store.close()


def test_a_moderators_redaction_read_after_the_voters_later_one_still_withdraws_at_its_place(
        tmp_path: Path) -> None:
    """A moderator redacts Carol's vote, Alice votes, and Carol redacts it
    herself later; Carol's reaches the bridge first.  Her vote stopped
    counting at the moderator's redaction, before Alice's: nothing was
    decided (only the voter's own redactions were looked at)."""
    room = Room(tmp_path, approval=APPROVAL, posted_ms=T0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([answer("$v", CY, T0 + 1, "main")])
    room.deliver([redact("$r2", CY, T0 + 5, "$v")])
    room.deliver([redact("$r1", MODERATOR, T0 + 3, "$v"), answer("$a", ANA, T0 + 4, "main")])
    record = room.record()
    assert record is not None and record["state"] == "pending", record
    assert [(v["sender"], v["event_id"]) for v in record["votes"]] == [(ANA, "$a")]
    assert room.verify() == []
    room.store.close()
