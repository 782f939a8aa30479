"""Any Matrix event -> the answer it means (or a withdrawal, or nothing).

Every way of answering becomes one ``question.answer.v2`` content so the
judge sees one shape.  Pure: the few facts it needs from the past (which
event is a question, what an answer said before it was redacted) come
through ``Lookup``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bridge.protocol.judge import IncomingAnswer
from bridge.protocol.recorded import RecordedQuestion

ANSWER_TYPE = "dev.superpipeline.question.answer.v2"


class Lookup(Protocol):
    def question_by_event(self, event_id: str) -> RecordedQuestion | None: ...
    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None: ...
    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None: ...
    def answer_reference(self, event_id: str) -> str | None:
        """The question event an earlier accepted answer referred to."""


@dataclass(frozen=True)
class Candidate:
    answer: IncomingAnswer
    question: RecordedQuestion | None


@dataclass(frozen=True)
class Withdrawal:
    """The event ``target`` (an answer) was redacted."""

    target: str
    event_id: str
    room_id: str
    sender: str


def normalize(event: dict[str, Any], lookup: Lookup) -> Candidate | Withdrawal | None:
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    content = event.get("content")
    if kind == "m.room.redaction":
        # Room versions up to 10 put `redacts` on the event, 11 and later in the content.
        target = event.get("redacts")
        if not isinstance(target, str) and isinstance(content, dict):
            target = content.get("redacts")
        if isinstance(target, str):
            return Withdrawal(target, _s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"))
        return None
    if not isinstance(content, dict):
        return None
    if kind == ANSWER_TYPE or (kind == "m.room.message" and content.get("suite_event_type") == ANSWER_TYPE):
        return _answer_event(event, content, lookup, via="answer_event")
    if kind == "m.room.message" and _is_edit(content):
        new = content.get("m.new_content")
        if isinstance(new, dict) and new.get("suite_event_type") == ANSWER_TYPE:
            return _edit(event, content, new, lookup)
    return None


def _answer_event(event: dict[str, Any], content: dict[str, Any], lookup: Lookup, *, via: str) -> Candidate:
    return Candidate(_incoming(event, content, via), _question_for(content, lookup))


def _edit(event: dict[str, Any], content: dict[str, Any], new: dict[str, Any], lookup: Lookup) -> Candidate:
    # m.new_content cannot carry its own m.relates_to, so the edit inherits the
    # reference of the answer it replaces; the judge then checks it as usual.
    original = content["m.relates_to"].get("event_id")
    reference = lookup.answer_reference(original) if isinstance(original, str) else None
    merged = dict(new)
    if "m.relates_to" not in merged and reference:
        merged["m.relates_to"] = {"rel_type": "m.reference", "event_id": reference}
    return Candidate(_incoming(event, merged, "edit"), _question_for(merged, lookup))


def _question_for(content: dict[str, Any], lookup: Lookup) -> RecordedQuestion | None:
    # The elicitation id names the posting the person answered; the reference
    # is then checked against it by the judge.  Only without a known
    # elicitation id does the reference pick the question.
    elicitation = content.get("elicitation_id")
    if isinstance(elicitation, str):
        found = lookup.question_by_elicitation(elicitation)
        if found:
            return found
    relates = content.get("m.relates_to")
    if isinstance(relates, dict) and isinstance(relates.get("event_id"), str):
        return lookup.question_by_event(relates["event_id"])
    return None


def _incoming(event: dict[str, Any], content: Any, via: str) -> IncomingAnswer:
    ts = event.get("origin_server_ts")
    return IncomingAnswer(
        event_id=_s(event, "event_id"),
        room_id=_s(event, "room_id"),
        sender=_s(event, "sender"),
        origin_server_ts=ts if isinstance(ts, int) else 0,
        content=content,
        via=via,
    )


def _is_edit(content: dict[str, Any]) -> bool:
    relates = content.get("m.relates_to")
    return isinstance(relates, dict) and relates.get("rel_type") == "m.replace" and isinstance(relates.get("event_id"), str)


def _s(event: dict[str, Any], key: str) -> str:
    value = event.get(key)
    return value if isinstance(value, str) else ""
