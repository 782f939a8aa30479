"""When the answers an agent waits for have arrived: pure predicates over a
``read --all`` view, shared by ``askwright-bridge wait`` and the agents'
``wait`` (MCP and the HTTP long poll)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from bridge.answers.document import ANSWERED, EXPIRED
from bridge.answers.read import UNANSWERED, UNKNOWN

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII)

UNTIL_ANSWERED = "answered"
UNTIL_ALL = "all"


def has_answer(entry: dict[str, Any]) -> bool:
    """A pick for the question as it stands now (stale is null only when
    questions.json can't be read; the pick is then taken as it is)."""
    return entry["state"] == ANSWERED and entry["stale"] is not True


def parse_time(text: str) -> datetime | None:
    """An answers.json ``updated`` (an RFC 3339 date-time: date, time and
    offset, such as 2026-05-01T12:00:00.000Z) as an aware datetime; None when it is not one."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        return None
    text = text.upper()
    if text[17:19] == "60":  # a leap second: RFC 3339 has them, datetime does not
        text = text[:17] + "59" + text[19:]
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def newer(entry: dict[str, Any], after: datetime | None) -> bool:
    """Whether the entry's answer is later than ``after`` (every answer is, without ``after``)."""
    if after is None:
        return True
    moment = parse_time(entry["updated"]) if isinstance(entry.get("updated"), str) else None
    return moment is not None and moment > after


def has_expired(entry: dict[str, Any]) -> bool:
    """The question expired undecided (PROTOCOL 2a): no answer will come, and
    what it shows is never consent."""
    return entry["state"] == EXPIRED and entry["stale"] is not True


def asked(entry: dict[str, Any]) -> bool:
    """Waited for as one of the set's open questions: open, or closed by its
    deadline undecided (``read`` shows that ``closed``, PROTOCOL 2a).  Its
    expiry is how a wait for it ends (exit 4), never "no question open"."""
    return entry["status"] == "open" or (entry["status"] == "closed" and has_expired(entry))


def questions_unknown(view: dict[str, Any]) -> bool:
    """questions.json could not be modelled (mid-edit by its agent, say):
    which questions are open is not known.  A ``read --all`` view then lists
    only the answers, with status unknown, or nothing at all when there are
    none yet (a set that models lists every question)."""
    entries = view["answers"]
    return not entries or any(e["status"] == UNKNOWN for e in entries)


def _ended(entry: dict[str, Any]) -> bool:
    return has_answer(entry) or has_expired(entry)


def arrived(view: dict[str, Any], question: str | None, until: str, after: datetime | None = None) -> bool:
    """Whether a ``read --all`` view holds what ``wait`` is waiting for.

    ``after``: the ``updated`` of the last answer the waiter saw; only an
    answer later than that makes ``answered`` arrive, and ``all`` arrives
    when every open question has ended (answered or expired) and one of them
    is later.  An awaited question that expired ends the wait too
    (``expired_in`` tells)."""
    entries = view["answers"]
    if question is not None:
        return any(e["qid"] == question and ((has_answer(e) and newer(e, after)) or has_expired(e)) for e in entries)
    if until == UNTIL_ALL:
        if questions_unknown(view):
            return False  # which are open is not known: not "all arrived" on no answers
        skipped = not_needed(entries)
        counted = [e for e in entries if asked(e) and e["qid"] not in skipped]
        if not all(_ended(e) for e in counted):
            return False
        return after is None or not counted or any(newer(e, after) or has_expired(e) for e in counted)
    awaited = [e for e in entries if asked(e) or e["status"] == UNKNOWN]
    # An answer given in time to a question its deadline then closed
    # (``closed_at``) came while it was open: once the deadline had passed,
    # "wait" for the set said "none open" with the answer there.
    came = awaited + [e for e in entries if e["status"] == "closed" and e.get("closed_at")]
    return any(has_answer(e) and newer(e, after) for e in came) or (
        bool(awaited) and all(has_expired(e) for e in awaited))


def not_needed(entries: list[dict[str, Any]]) -> set[str]:
    """The questions no longer needed: one with ``show_if`` is needed only
    when that question's answer is one of its options (the room says "Only
    needed if ..."), so it is not once that answer is another, or once that
    question can get no answer (closed, expired, itself not needed).  While
    that answer may still come, it may be."""
    by_qid = {e["qid"]: e for e in entries}
    return {e["qid"] for e in entries if e.get("show_if") is not None and not _may_be_needed(e, by_qid)}


def _may_be_needed(entry: dict[str, Any], by_qid: dict[str, dict[str, Any]]) -> bool:
    seen: set[str] = set()
    while (condition := entry.get("show_if")) is not None and entry["qid"] not in seen:
        seen.add(entry["qid"])
        asked = by_qid.get(condition.get("question"))
        if asked is None:
            return True  # (a show_if naming no question: a lint error; not taken as settled)
        if has_answer(asked):
            picked = asked.get("choices") if asked.get("choice") is None else [asked["choice"]]
            return bool(set(picked or ()) & set(condition.get("option") or ()))
        if asked["status"] != "open" or has_expired(asked):
            return False
        entry = asked  # unanswered and open: needed as long as it may be
    return True


def in_the_set(view: dict[str, Any], question: str) -> bool:
    """Whether ``question`` is one of the set's to wait for.  A question
    removed from questions.json keeps its record in read's view (status
    "removed"), but no answer can come to it."""
    return any(e["qid"] == question and e.get("status") != "removed" for e in view["answers"]) \
        or questions_unknown(view)  # not known: it may well be, once questions.json reads again


def unanswerable(view: dict[str, Any], question: str | None, until: str) -> str | None:
    """Why what is awaited can get no answer now, once ``arrived`` does not
    hold (None: it can): the question closed, withdrawn or superseded (a
    wait for it hung for ever), or no question of the set open."""
    entries = view["answers"]
    if question is not None:
        status = next((e["status"] for e in entries if e["qid"] == question), None)
        if status is None:  # it was there when the wait began (``in_the_set``), unanswered, and is gone
            return None if questions_unknown(view) else f"question {question!r} is removed: it can get no answer now"
        if status in ("open", UNKNOWN):
            return None
        return f"question {question!r} is {status}: it can get no answer now"
    if until != UNTIL_ALL and not questions_unknown(view) and not any(e["status"] == "open" for e in entries):
        return "no question of the set is open: none can get an answer now"
    return None


def expired_in(view: dict[str, Any], question: str | None, until: str) -> list[str]:
    """The awaited questions that expired undecided, once ``arrived`` holds:
    ``wait`` exits 4 when there is one (the awaited answer never came)."""
    entries = view["answers"]
    if question is not None:
        return [e["qid"] for e in entries if e["qid"] == question and has_expired(e)]
    awaited = [e for e in entries if asked(e) or e["status"] == UNKNOWN]
    if until != UNTIL_ALL and any(has_answer(e) for e in awaited):
        return []
    skipped = not_needed(entries) if until == UNTIL_ALL else set()
    return [e["qid"] for e in awaited if has_expired(e) and e["qid"] not in skipped]


def as_read(view: dict[str, Any], include_all: bool) -> dict[str, Any]:
    """The view ``read`` prints: ``read --all``'s without the unanswered
    entries when --all was not given (one reading of the files serves both
    the check and the output, so what is printed is what was checked)."""
    if include_all:
        return view
    return {**view, "answers": [e for e in view["answers"] if e["state"] != UNANSWERED]}
