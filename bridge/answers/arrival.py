"""When the answers an agent waits for have arrived: pure predicates over a
``read --all`` view, shared by ``askwright-bridge wait`` and the agents'
``wait`` (MCP and the HTTP long poll)."""

from __future__ import annotations

from typing import Any

from bridge.answers.document import ANSWERED, EXPIRED
from bridge.answers.read import UNANSWERED, UNKNOWN

UNTIL_ANSWERED = "answered"
UNTIL_ALL = "all"


def has_answer(entry: dict[str, Any]) -> bool:
    """A pick for the question as it stands now (stale is null only when
    questions.json can't be read; the pick is then taken as it is)."""
    return entry["state"] == ANSWERED and entry["stale"] is not True


def has_expired(entry: dict[str, Any]) -> bool:
    """The question expired undecided (PROTOCOL 2a): no answer will come, and
    what it shows is never consent."""
    return entry["state"] == EXPIRED and entry["stale"] is not True


def _ended(entry: dict[str, Any]) -> bool:
    return has_answer(entry) or has_expired(entry)


def arrived(view: dict[str, Any], question: str | None, until: str) -> bool:
    """Whether a ``read --all`` view holds what ``wait`` is waiting for.  An
    awaited question that expired ends the wait too (``expired_in`` tells)."""
    entries = view["answers"]
    if question is not None:
        return any(e["qid"] == question and _ended(e) for e in entries)
    if until == UNTIL_ALL:
        if any(e["status"] == UNKNOWN for e in entries):
            return False  # questions.json can't be read: which are open is not known
        return all(_ended(e) for e in entries if e["status"] == "open")
    awaited = [e for e in entries if e["status"] in ("open", UNKNOWN)]
    return any(has_answer(e) for e in awaited) or (bool(awaited) and all(_ended(e) for e in awaited))


def expired_in(view: dict[str, Any], question: str | None, until: str) -> list[str]:
    """The awaited questions that expired undecided, once ``arrived`` holds:
    ``wait`` exits 4 when there is one (the awaited answer never came)."""
    entries = view["answers"]
    if question is not None:
        return [e["qid"] for e in entries if e["qid"] == question and has_expired(e)]
    awaited = [e for e in entries if e["status"] in ("open", UNKNOWN)]
    if until != UNTIL_ALL and any(has_answer(e) for e in awaited):
        return []
    return [e["qid"] for e in awaited if has_expired(e)]


def as_read(view: dict[str, Any], include_all: bool) -> dict[str, Any]:
    """The view ``read`` prints: ``read --all``'s without the unanswered
    entries when --all was not given (one reading of the files serves both
    the check and the output, so what is printed is what was checked)."""
    if include_all:
        return view
    return {**view, "answers": [e for e in view["answers"] if e["state"] != UNANSWERED]}
