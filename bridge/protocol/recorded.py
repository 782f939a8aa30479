"""RecordedQuestion: one question revision exactly as the bridge posted it.

Answers are judged against this record, never against what ``questions.json``
says now: the person answered what they saw.  The accessors read the posted
content defensively (a question event loaded from a file by ``validate`` may
be anything), returning empty values instead of raising, and cache their
results because the same record is consulted for every answer to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from bridge.protocol.audit_leaf import posted_quorum
from bridge.protocol.deadline import event_time_ms
from bridge.protocol.render import option_display, shown_title
from bridge.questionset.builtin import BUILTIN_IDS

# The answer schema's own cap on `text`; a question without `text_max` gets it.
TEXT_MAX_DEFAULT = 16000


@dataclass(frozen=True)
class RecordedQuestion:
    event_id: str  # the question.v2 message's event id
    room_id: str
    set_id: str
    content: dict  # the question.v2 content exactly as posted
    open: bool = True  # False once closed / withdrawn / superseded / replaced by a new rev
    closed_why: str | None = None  # why it was closed, in words ("this set was removed"), when known

    @classmethod
    def from_event(cls, event: Any, *, open: bool = True, set_id: str | None = None) -> RecordedQuestion:
        """A record of a whole question.v2 event (event_id, room_id, content).

        Raises ValueError naming what is missing: the caller is the one that
        can say which file or message it was.
        """
        if not isinstance(event, dict):
            raise ValueError("the question event is not a JSON object")
        for key in ("event_id", "room_id"):
            if not isinstance(event.get(key), str) or not event[key]:
                raise ValueError(f"the question event has no {key}")
        content = event.get("content")
        if not isinstance(content, dict):
            raise ValueError("the question event has no content object")
        if set_id is None:
            posted_set = content.get("set")
            set_id = posted_set.get("id") if isinstance(posted_set, dict) else None
        return cls(
            event_id=event["event_id"],
            room_id=event["room_id"],
            set_id=set_id if isinstance(set_id, str) else "",
            content=content,
            open=open,
        )

    @cached_property
    def question(self) -> dict[str, Any]:
        value = self.content.get("question") if isinstance(self.content, dict) else None
        return value if isinstance(value, dict) else {}

    @cached_property
    def qid(self) -> str | None:
        return _str_or_none(self.question.get("id"))

    @cached_property
    def rev(self) -> int | None:
        value = self.question.get("rev")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @cached_property
    def elicitation_id(self) -> str | None:
        return _str_or_none(self.content.get("elicitation_id")) if isinstance(self.content, dict) else None

    @cached_property
    def kind(self) -> str | None:
        return _str_or_none(self.question.get("kind"))

    @cached_property
    def options(self) -> tuple[dict[str, Any], ...]:
        """The offered options, built-ins included, as posted (malformed entries left out)."""
        raw = self.question.get("options")
        if not isinstance(raw, list):
            return ()
        return tuple(o for o in raw if isinstance(o, dict) and isinstance(o.get("id"), str))

    @cached_property
    def offered_ids(self) -> frozenset[str]:
        return frozenset(o["id"] for o in self.options)

    @cached_property
    def option_inputs(self) -> dict[str, str | None]:
        """Option id -> "required" | "optional" | None (takes no text)."""
        return {o["id"]: _input_mode(o.get("input")) for o in self.options}

    @cached_property
    def labels(self) -> dict[str, str]:
        return {o["id"]: o["label"] for o in self.options if isinstance(o.get("label"), str)}

    @cached_property
    def rankable_ids(self) -> tuple[str, ...]:
        """The ids a rank answer must order: every offered id but the built-ins, in posted order."""
        return tuple(o["id"] for o in self.options if o["id"] not in BUILTIN_IDS)

    @cached_property
    def text_max(self) -> int:
        value = self.question.get("text_max")
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= TEXT_MAX_DEFAULT:
            return value
        return TEXT_MAX_DEFAULT

    @cached_property
    def subject(self) -> tuple[str, str] | None:
        """(id, digest) on a subject-bound question, else None."""
        value = self.content.get("subject") if isinstance(self.content, dict) else None
        if not isinstance(value, dict):
            return None
        sid, digest = value.get("id"), value.get("digest")
        if isinstance(sid, str) and isinstance(digest, str):
            return sid, digest
        return None

    @cached_property
    def expires_ms(self) -> int | None:
        """When the question expires (ms since the epoch), as posted; None without a deadline."""
        return event_time_ms(self.question.get("expires"))

    @cached_property
    def answerers(self) -> frozenset[str] | None:
        """The people the question names as its answerers; None when it names none (anyone the bridge accepts)."""
        value = self.question.get("answerers")
        if not isinstance(value, list):
            return None
        return frozenset(a for a in value if isinstance(a, str))

    @cached_property
    def escalation(self) -> tuple[int, tuple[str, ...]] | None:
        """(when, who) of the question's ``escalate``, as posted."""
        value = self.question.get("escalate")
        if not isinstance(value, dict):
            return None
        at = event_time_ms(value.get("after"))
        to = tuple(t for t in value.get("to") or () if isinstance(t, str))
        return (at, to) if at is not None and to else None

    @cached_property
    def quorum(self) -> tuple[int, frozenset[str]] | None:
        """(required, veto option ids) of a quorum question, as posted.  Read
        by the answer log's own reading (``posted_quorum``), so what the
        bridge counts is what every leaf about the question says it counted."""
        posted = posted_quorum(self.question)
        return None if posted is None else (posted["required"], frozenset(posted["veto"]))

    def may_answer_at(self, sender: str, ts: int) -> bool:
        """Whether the question's own ``answerers`` (and, from its escalation on, ``escalate.to``) include ``sender``."""
        if self.answerers is None:
            return True
        if sender in self.answerers:
            return True
        return self.escalation is not None and ts >= self.escalation[0] and sender in self.escalation[1]

    def answerers_at(self, ts: int) -> list[str]:
        """Who may answer at ``ts``, in the posted order (for the word back)."""
        people = list(self.question.get("answerers") or ())
        if self.escalation is not None and ts >= self.escalation[0]:
            people += [p for p in self.escalation[1] if p not in people]
        return [p for p in people if isinstance(p, str)]

    @property
    def subject_bound(self) -> bool:
        # A `subject` key of the wrong shape still marks the question as bound:
        # failing closed is the safe reading for an approval.
        return isinstance(self.content, dict) and "subject" in self.content

    @cached_property
    def guess(self) -> dict[str, Any] | None:
        value = self.question.get("guess")
        return value if isinstance(value, dict) else None

    @cached_property
    def sides(self) -> dict[str, str]:
        """Side name -> option id (``randomized`` and non-string values left out)."""
        value = self.question.get("sides")
        if not isinstance(value, dict):
            return {}
        return {k: v for k, v in value.items() if k != "randomized" and isinstance(v, str)}

    def option_input(self, option_id: str) -> str | None:
        return self.option_inputs.get(option_id)

    def label(self, option_id: str) -> str | None:
        return self.labels.get(option_id)

    def side_of(self, option_id: str) -> str | None:
        for side, oid in self.sides.items():
            if oid == option_id:
                return side
        return None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _input_mode(value: Any) -> str | None:
    return value if value in ("required", "optional") else None


def option_name(question: RecordedQuestion, option_id: str) -> str:
    """An offered option in the person's terms: its number in the message and
    what it reads as there (the side on a compare, never the id).  An id the
    question does not offer is quoted as given."""
    for number, option in enumerate(question.options, start=1):
        if option["id"] == option_id:
            return f"{number} (\u201c{shown_title(option_display(question.question, option))}\u201d)"
    return f"\u201c{shown_title(option_id)}\u201d"
