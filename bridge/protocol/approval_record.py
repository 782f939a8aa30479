"""A question's record with its approval fields applied (PROTOCOL 2a).

Pure.  ``base`` is the record the log's standing pick makes
(``annotate.fold_records``); a question with a ``quorum`` or an ``expires``
turns it into what the room decided: ``pending`` with its votes, ``answered``
with the decided option and who decided it, or ``expired``.
"""

from __future__ import annotations

from typing import Any

from bridge.protocol.audit_leaf import answer_sha256
from bridge.protocol.deadline import format_rfc3339
from bridge.protocol.quorum import ANSWERED, EXPIRED, PENDING, STANDING, Cast, Tally, tally
from bridge.protocol.recorded import RecordedQuestion

_PICK_FIELDS = ("choice", "label", "side", "choices", "order", "text", "matched_guess")


def approval_record(base: dict[str, Any] | None, posting: RecordedQuestion | None, casts: list[Cast], *,
                    expired: bool, count: int, fallback: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``fallback``: the posting's latest accepted pick, withdrawn or not, for
    a decision whose every vote was withdrawn after it (the record still
    needs its revision, time and source)."""
    if posting is None or posting.qid is None:
        return base
    quorum = posting.quorum
    # What stands for an earlier revision answers none of this one's: at this
    # revision's deadline it expired unanswered, whatever the one before got.
    ours = of_revision(base, posting)
    if quorum is None:
        if not expired or posting.expires_ms is None:
            return base
        if ours is not None and ours.get("state") in STANDING:
            # Answered in time ("not sure" too): the answer stands, the deadline
            # only closed it.  ``closed_at`` says so: a "not sure" alone reads as
            # a question still waiting for its answer, and ``wait`` waited on.
            return {**ours, "closed_at": format_rfc3339(posting.expires_ms)}
        return _expired(ours, posting, count, votes=None)
    required, veto = quorum
    result = tally(casts, required=required, veto=veto, expires_ms=posting.expires_ms,
                   expired=expired and posting.expires_ms is not None)
    if result.state is None:
        if ours is None or ours.get("state") != ANSWERED:
            # Nothing stands, or "not sure": no vote, and no pick to act on;
            # or what stands answers an earlier revision, no pick on this one.
            return base
        # A standing pick that is no vote ("other"): the person's words are
        # kept, and the question is as undecided as before it.
        result = Tally(PENDING, [])
    if result.state == EXPIRED:
        return _expired(ours, posting, count, votes=result.votes, required=required)
    out = {k: v for k, v in (base or fallback or {}).items() if k not in _PICK_FIELDS}
    if base is None and fallback is not None:
        out.pop("note", None)
        out["rev"] = max(count, 1)
    out["votes"] = result.votes
    out["required"] = required
    if result.state == PENDING:
        out["state"] = PENDING
        return out
    out["state"] = ANSWERED
    out["choice"] = result.choice
    label = posting.label(result.choice or "")
    if label is not None:
        out["label"] = label
    side = posting.side_of(result.choice or "") if posting.kind == "compare" else None
    if side is not None:
        out["side"] = side
    if posting.guess is not None:
        out["matched_guess"] = posting.guess.get("option") == result.choice
    out["decided_by"] = list(result.decided_by)
    if expired and posting.expires_ms is not None:
        # Decided in time, then the deadline came: as an answer given in time
        # to a question without a quorum, the decision stands and the
        # question is closed (``read`` says ``closed``, not ``open``).
        out["closed_at"] = format_rfc3339(posting.expires_ms)
    return out


def of_revision(record: dict[str, Any] | None, posting: RecordedQuestion) -> dict[str, Any] | None:
    """``record`` when it answers ``posting``'s revision, else None."""
    return record if record is not None and (record.get("q_rev") or 1) == (posting.rev or 1) else None


def outcome_of(record: dict[str, Any] | None) -> str | None:
    """The approval outcome a record shows, as the answer log names it:
    ``expired``, ``decided`` (a quorum's decision), or None (neither)."""
    if record is None:
        return None
    if record.get("state") == EXPIRED:
        return "expired"
    return "decided" if record.get("state") == ANSWERED and record.get("decided_by") else None


STANDS = "stands"  # closed at its deadline, the answer given before it standing (no quorum to decide)


def told_outcome(record: dict[str, Any] | None) -> str | None:
    """What the room is told of a question its deadline or quorum closed, as
    the record stands: ``decided``, ``expired`` (undecided), ``stands`` (an
    answer given in time, no quorum), or None (nothing to tell yet)."""
    outcome = outcome_of(record)
    if outcome is None and record is not None and record.get("state") in STANDING:
        return STANDS
    return outcome


def outcome_mark(outcome: str, record: dict[str, Any] | None) -> str:
    """What tells one logged approval outcome from the next: the outcome
    and, with the record, the hash of the decision it holds (a decision can
    change and stay ``decided``: a veto read late, other deciders)."""
    return outcome if record is None else f"{outcome} {answer_sha256(record, outcome)}"


def _expired(base: dict[str, Any] | None, posting: RecordedQuestion, count: int, *, votes: list[dict[str, Any]] | None,
             required: int | None = None) -> dict[str, Any]:
    at = format_rfc3339(posting.expires_ms or 0)
    out: dict[str, Any] = {k: v for k, v in (base or {}).items() if k not in _PICK_FIELDS}
    out.update(qid=posting.qid, state=EXPIRED)
    if votes is not None:
        out["votes"] = votes
        out["required"] = required
    out["expired_at"] = at
    if posting.subject is not None:
        # What was to be approved, with no pick standing too (its votes were
        # cast on it: their leaves hashed it, and ``read`` shows it).
        out.setdefault("subject", {"id": posting.subject[0], "digest": posting.subject[1]})
    out.setdefault("q_rev", posting.rev or 1)
    out.setdefault("rev", max(count, 1))
    out.setdefault("updated", at)
    out.setdefault("source", {"via": "matrix", "how": "expiry", "room_id": posting.room_id,
                              "event_id": posting.event_id})
    return out
