"""A quorum question's votes, decision and deadline, as a pure projection of the room (PROTOCOL 2a).

Each permitted person's standing pick (their latest in the room's order; an
edit changes it, a redaction or an emptied poll vote withdraws it) is a
vote; ``unsure`` and ``other`` are not votes.  The question is decided at the
first point of the room's order where ``required`` distinct people's votes
agree on one option, or at once when anyone picks a ``veto`` option.  What
happens after that point is recorded without changing the decision.  Not
decided before the deadline, and the deadline reached: ``expired``, which
is never consent, whatever votes stood; the record lists those that stood
at the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bridge.protocol.deadline import clock_words, format_rfc3339
from bridge.questionset.builtin import BUILTIN_IDS

PENDING = "pending"
EXPIRED = "expired"
ANSWERED = "answered"
UNSURE = "unsure"
# What an answer given before a deadline leaves standing when no quorum
# decides: the deadline closes the question and the answer stays.
STANDING = (ANSWERED, UNSURE)

Position = tuple[int, int]  # (origin_server_ts, arrival): the room's order
NEVER: Position = (2**62, 2**62)


@dataclass(frozen=True)
class Cast:
    """One accepted pick from the log, with when (if ever) the room withdrew it."""

    sender: str
    choice: str | None  # the option id picked (None: a pick that is no option, never a vote)
    event_id: str
    at: Position
    withdrawn_at: Position = NEVER
    original: str | None = None  # the event an edit edits: the edit stands for it
    note: str = ""  # what the voter wrote with the pick ("only after 5pm"): their vote's words


@dataclass
class Tally:
    state: str | None  # pending | answered | expired | None (no vote has stood)
    votes: list[dict[str, Any]] = field(default_factory=list)  # standing now, in the room's order
    choice: str | None = None  # the decided option
    decided_by: list[str] = field(default_factory=list)
    decided_at: Position | None = None
    veto: bool = False


def is_vote(choice: str | None) -> bool:
    return isinstance(choice, str) and choice not in BUILTIN_IDS


def standing(casts: list[Cast], until: Position) -> dict[str, Cast]:
    """Each sender's standing pick at ``until``: their latest cast not withdrawn by then
    (an edit replaces what it edits while it stands)."""
    live = [c for c in casts if c.at <= until and (c.withdrawn_at > until or c.withdrawn_at == NEVER)]
    latest: dict[str, Cast] = {}
    for cast in sorted(live, key=lambda c: c.at):
        latest[cast.sender] = cast
    return latest


def _decision(now: dict[str, Cast], step: Cast | None, required: int, veto: frozenset[str]) -> tuple[str, list[str], bool] | None:
    if step is not None and now.get(step.sender) is step and step.choice in veto:
        return step.choice, [step.sender], True
    by_option: dict[str, list[Cast]] = {}
    for cast in now.values():
        if is_vote(cast.choice):
            by_option.setdefault(cast.choice, []).append(cast)
    for option, group in sorted(by_option.items(), key=lambda kv: min(c.at for c in kv[1])):
        if len(group) >= required:
            return option, [c.sender for c in sorted(group, key=lambda c: c.at)], False
    return None


def tally(casts: list[Cast], *, required: int, veto: frozenset[str], expires_ms: int | None,
          expired: bool) -> Tally:
    """The quorum's outcome from every cast of the posting (withdrawn ones included, with when)."""
    points = sorted({c.at for c in casts} | {c.withdrawn_at for c in casts if c.withdrawn_at != NEVER})
    by_at = {c.at: c for c in casts}
    decided: tuple[str, list[str], bool] | None = None
    decided_at: Position | None = None
    for point in points:
        if expires_ms is not None and point[0] >= expires_ms:
            break  # nothing after the deadline decides (the judge refuses such votes anyway)
        found = _decision(standing(casts, point), by_at.get(point), required, veto)
        if found is not None:
            decided, decided_at = found, point
            break
    now = standing(casts, NEVER)
    votes = [vote_entry(c) for c in sorted(now.values(), key=lambda c: c.at) if is_vote(c.choice)]
    if decided is not None:
        choice, by, was_veto = decided
        return Tally(ANSWERED, votes, choice, by, decided_at, was_veto)
    if expired:
        # What stood at the deadline, in the room's order: a vote taken back
        # after it was still standing when the question expired.
        last = standing(casts, (expires_ms - 1, NEVER[1])) if expires_ms is not None else now
        return Tally(EXPIRED, [vote_entry(c) for c in sorted(last.values(), key=lambda c: c.at) if is_vote(c.choice)])
    return Tally(PENDING if votes else None, votes)


def vote_entry(cast: Cast) -> dict[str, Any]:
    """A vote as the record lists it; its ``note`` where the voter wrote one:
    the record's own note is one person's (its ``source.sender``), and a
    decider's condition was lost once another's vote decided."""
    entry = {"sender": cast.sender, "choice": cast.choice, "event_id": cast.event_id, "at": format_rfc3339(cast.at[0])}
    if cast.note:
        entry["note"] = cast.note
    return entry


def progress_words(result: Tally, required: int, people: list[str], labels: dict[str, str]) -> str:
    """The word back after a vote: "1 of 2 for “Ship it” so far; waiting for @bo or @cy"
    ("…, 1 for “Wait” so far" when another option has votes too)."""
    if result.state == ANSWERED:
        return decision_words(result, labels)
    if result.state == EXPIRED:
        return f"This question expired undecided: {stood_words(result, required, labels)}."
    counts: dict[str, int] = {}
    for vote in result.votes:
        counts[vote["choice"]] = counts.get(vote["choice"], 0) + 1
    if not counts:
        return f"No votes stand yet; {required} must agree."
    # Every option voted for, the most first: naming only the leader told a
    # voter whose option was tied with another the count of the other.
    ranked = sorted(counts, key=lambda k: -counts[k])
    voted = {v["sender"] for v in result.votes}
    waiting = [p for p in people if p not in voted]
    line = f"{counts[ranked[0]]} of {required} for \u201c{labels.get(ranked[0], ranked[0])}\u201d" + "".join(
        f", {counts[k]} for \u201c{labels.get(k, k)}\u201d" for k in ranked[1:]) + " so far"
    if people:
        line += _still_needed(required - counts[ranked[0]], waiting, required)
    return line + "."


def _still_needed(short: int, waiting: list[str], required: int) -> str:
    """Who the decision waits for, ``short`` votes short on the option
    closest to ``required``: "waiting for @b or @c" read as if either would
    do when both were needed, and when not enough people are left to agree
    it waited for nothing that could decide it."""
    if short > len(waiting):
        # (A veto could still decide it; agreement can't, unless a vote changes.)
        return (f"; with {'no one' if not waiting else 'only ' + joined(waiting)} left to vote, no option can get"
                f" the {required} agreeing votes needed unless someone changes their vote")
    if not waiting:
        return ""
    if short == len(waiting):
        return "; waiting for " + joined(waiting, "and")
    if short == 1:
        return "; waiting for " + joined(waiting, "or")
    return f"; waiting for {short} more of " + joined(waiting, "and")


def joined(names: list[str], word: str = "and") -> str:
    """"a", "a and b", "a, b and c"."""
    if len(names) <= 2:
        return f" {word} ".join(names)
    return ", ".join(names[:-1]) + f" {word} " + names[-1]


def stood_words(result: Tally, required: int, labels: dict[str, str] | None = None) -> str:
    """What stood when the question expired, each vote named, so nobody reads
    the numbers as a result: "1 of the 2 votes needed (“Ship it”: @ana)"."""
    labels = labels or {}
    groups: dict[str, list[str]] = {}
    for vote in result.votes:
        groups.setdefault(vote["choice"], []).append(vote["sender"])
    if not groups:
        return "no votes"
    who = "; ".join(f"\u201c{labels.get(c, c)}\u201d: {joined(s)}" for c, s in groups.items())
    needed = f"the {required} {'vote' if required == 1 else 'votes'} needed"
    if len(groups) == 1:
        return f"{max(len(s) for s in groups.values())} of {needed} ({who})"
    return f"no option had {needed} ({who})"


def decision_line(result: Tally, labels: dict[str, str]) -> str:
    """The decision as the question's closing line and the poll's end say it.
    A veto is named as one: a poll's tally knows nothing of vetoes, and one
    veto against one approval looks like a tie there."""
    label = labels.get(result.choice or "", result.choice or "")
    if result.veto:
        return f"vetoed: \u201c{label}\u201d by {joined(result.decided_by)}"
    return f"decided: \u201c{label}\u201d by {joined(result.decided_by)}"


def decision_words(result: Tally, labels: dict[str, str]) -> str:
    """The decision's announcement in the thread (and the word back to a vote after it)."""
    line = decision_line(result, labels)
    words = line[:1].upper() + line[1:] + "."
    if result.veto:
        words += " A veto decides at once, whatever the other votes."
    return words


def expiry_words(record: dict[str, Any] | None, required: int | None, expires_ms: int,
                 labels: dict[str, str] | None = None) -> tuple[str, str]:
    """What the room is told when the deadline passes, from the record as it
    stands then: the thread's notice and the question's closing line ("expired
    undecided at 14:00 UTC: 1 of the 2 votes needed (“Ship it”: @ana)").
    ``required``: the quorum's, None without one; ``labels``: option id ->
    label.  The same words the bridge says at expiry are scheduled ahead in
    the homeserver's delayed closing edit, so the room reads alike whether
    the bridge was up at the deadline or not."""
    record = record or {}
    at = clock_words(expires_ms)
    # On an approval only a decision stands: a "not sure" is no vote, and
    # the question expires undecided however many said it.
    if record.get("state") in ((ANSWERED,) if required else STANDING):
        return (f"The deadline ({format_rfc3339(expires_ms)}) has passed; the answer given before it stands.",
                f"closed at its deadline, {at}")
    stood = stood_words(Tally(record.get("state"), record.get("votes") or []), required, labels) if required \
        else "no answer"
    return (f"This question expired undecided at {at}: {stood}. It is not approved, and later answers are not "
            "recorded.", f"expired undecided at {at}: {stood}")
