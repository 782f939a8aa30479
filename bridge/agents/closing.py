"""Closing or withdrawing questions of a set: a pure rewrite of questions.json.

The bridge's poster then does what it does for any agent that edits its file:
the question is closed in the room and answers to it are refused."""

from __future__ import annotations

import copy
from typing import Any

from bridge.agents.errors import BadRequest, Unprocessable

CLOSED = "closed"
WITHDRAWN = "withdrawn"
NO_OPEN_QUESTION = "at least one question must be open"


def close_questions(raw: dict[str, Any], qids: list[str] | None, status: str, reason: str | None) -> tuple[dict[str, Any], list[str]]:
    """(the new questions.json, the ids it closed).  ``qids`` None closes every
    open question.  A question already closed is left as it is; an id the set
    does not have is refused."""
    if status not in (CLOSED, WITHDRAWN):
        raise BadRequest(f"status must be {CLOSED} or {WITHDRAWN}")
    reason = reason.strip() if isinstance(reason, str) else None
    if status == WITHDRAWN and not reason:
        raise BadRequest("a withdrawn question needs a reason")
    new = copy.deepcopy(raw)
    questions = [q for q in new.get("questions") or [] if isinstance(q, dict)]
    known = {q.get("id") for q in questions}
    if qids is not None:
        missing = [qid for qid in qids if qid not in known]
        if missing:
            raise Unprocessable(f"no question {missing[0]!r} in this set")
    done = []
    for question in questions:
        if (qids is None or question.get("id") in qids) and question.get("status", "open") == "open":
            question["status"] = status
            if reason:
                question["reason"] = reason
            done.append(question.get("id"))
    return new, done


def blocks_close(finding_where: str, finding_message: str) -> bool:
    """Whether a lint error stops a close: every error does but "no question
    is open", which is what closing the last one means."""
    return not (finding_where == "questions" and finding_message == NO_OPEN_QUESTION)
