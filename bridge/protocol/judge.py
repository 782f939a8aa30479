"""Judging one incoming answer against the question the bridge recorded.

Every way of answering is normalised into a ``question.answer.v2`` content and
judged here, by two layers in order:

* ``schema``: the content against the answer event's JSON Schema (the seed's
  fields, limits and cross-field rule);
* ``recorded``: the content against the question as the bridge posted it
  (PROTOCOL section 3): the reference, the elicitation, the room, the sender,
  whether the question is open, the subject binding, and the pick itself.

``judge`` is pure and never raises: whatever arrives becomes a ``Refused``
with a stable reason code and a message the person can read.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.exceptions import ValidationError

from bridge.protocol import schemas
from bridge.protocol.deadline import clock_words, format_rfc3339
from bridge.protocol.graphemes import shorten
from bridge.protocol.recorded import RecordedQuestion, option_name
from bridge.protocol.render import why_in_brackets
from bridge.questionset.builtin import BUILTIN_IDS, OTHER_ID, UNSURE_ID

Layer = Literal["schema", "recorded"]

# The server's cap on a record's note (question-set format, "What comes back").
# An option's input and the `note` extension both end up in the note.
NOTE_MAX = 20_000
NOTE_JOINER = "\n\n"


@dataclass(frozen=True)
class IncomingAnswer:
    event_id: str
    room_id: str
    sender: str
    origin_server_ts: int
    content: Any  # anything at all; the schema layer decides
    via: str = "answer_event"  # answer_event | poll | reply | reaction | edit

    @classmethod
    def from_event(cls, event: dict[str, Any], *, via: str = "answer_event") -> IncomingAnswer:
        """An answer from a whole answer event; the content is taken as is, even if absent."""
        ts = event.get("origin_server_ts")
        return cls(
            event_id=_str(event.get("event_id")),
            room_id=_str(event.get("room_id")),
            sender=_str(event.get("sender")),
            origin_server_ts=ts if isinstance(ts, int) and not isinstance(ts, bool) else 0,
            content=event.get("content"),
            via=via,
        )


@dataclass(frozen=True)
class JudgeContext:
    allowed: frozenset[str] | None  # answerers from config; None = room members
    members: frozenset[str]  # joined members of the room at the answer (as the timeline has them)
    bridge_user: str


@dataclass(frozen=True)
class Accepted:
    qid: str
    q_rev: int
    option_id: str | None  # the one option picked (any kind; on multi/rank only a built-in)
    text: str | None  # a text question's answer, or the input given with option_id (never blank)
    choices: tuple[str, ...] | None  # multi: the picked ids in the order given
    order: tuple[str, ...] | None  # rank: every option id once, best first
    note: str | None  # the `note` extension, as sent
    kind: str | None = None
    via: str = "answer_event"
    event_id: str = ""
    elicitation_id: str = ""


@dataclass(frozen=True)
class Refused:
    layer: Layer
    reason: str  # a stable snake_case code, see REASONS
    message: str  # plain words for the person who answered


# Every reason code -> its layer.  docs/reason-codes.md documents each one.
REASONS: dict[str, Layer] = {
    # schema layer
    "not_an_object": "schema",
    "missing_field": "schema",
    "wrong_type": "schema",
    "wrong_value": "schema",
    "too_short": "schema",
    "too_long": "schema",
    "no_answer": "schema",
    "invalid_content": "schema",
    # recorded layer
    "from_bridge": "recorded",
    "unknown_question": "recorded",
    "wrong_reference": "recorded",
    "wrong_room": "recorded",
    "sender_not_allowed": "recorded",
    "wrong_elicitation": "recorded",
    "question_closed": "recorded",
    "subject_missing": "recorded",
    "wrong_subject": "recorded",
    "wrong_digest": "recorded",
    "unexpected_subject": "recorded",
    "text_too_long": "recorded",
    "option_not_offered": "recorded",
    "input_required": "recorded",
    "option_required": "recorded",
    "wrong_encoding": "recorded",
    "builtin_in_list": "recorded",
    "choice_repeated": "recorded",
    "no_choices": "recorded",
    "rank_incomplete": "recorded",
    "note_too_long": "recorded",
    "not_an_answerer": "recorded",
    "expired": "recorded",
    "poll_ended": "recorded",
    # either layer: a bug in the judge itself, never expected
    "unjudgeable": "schema",
}


def judge(question: RecordedQuestion | None, answer: IncomingAnswer, ctx: JudgeContext) -> Accepted | Refused:
    """Accept or refuse ``answer`` as an answer to ``question``.

    ``question`` is None when the answer's reference names no question the
    bridge recorded.  Never raises, but OSError: the machine failing (out of
    descriptors while the schema is first read) says nothing of the answer,
    and the batch is tried again rather than the answer refused for good.
    """
    try:
        refusal = check_schema(answer.content)
    except OSError:
        raise
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return _unjudgeable("schema")
    if refusal is not None:
        return refusal
    try:
        return check_recorded(question, answer, ctx)
    except OSError:
        raise
    except Exception:  # noqa: BLE001
        return _unjudgeable("recorded")


def _unjudgeable(layer: Layer) -> Refused:
    return Refused(layer, "unjudgeable", "The bridge could not judge this answer. Please try answering again.")


# --------------------------------------------------------------------------
# schema layer


def check_schema(content: Any) -> Refused | None:
    """The schema layer alone: None when ``content`` fits the answer schema."""
    # One run of the validator per event: the full error list is only walked
    # when there is something to report.
    errors = schemas.errors(schemas.ANSWER, content)
    if not errors:
        return None
    return _schema_refusal(min(errors, key=_error_rank))


# Which error to report when there are several: the person is best served by
# the most basic problem first, and the cross-field rule only when nothing
# more specific is wrong.
_KEYWORD_RANK = {
    "type": 0,
    "required": 1,
    "const": 2,
    "enum": 2,
    "minimum": 2,
    "minLength": 3,
    "maxLength": 4,
    "anyOf": 9,
}


def _error_rank(error: ValidationError) -> tuple[int, int, tuple[str, ...]]:
    path = tuple(str(p) for p in error.absolute_path)
    rank = -1 if (error.validator == "type" and not path) else _KEYWORD_RANK.get(str(error.validator), 5)
    return rank, len(path), path


def _field(error: ValidationError, leaf: str | None = None) -> str:
    parts = [str(p) for p in error.absolute_path]
    if leaf is not None:
        parts.append(leaf)
    return ".".join(parts) or "content"


def _schema_refusal(error: ValidationError) -> Refused:
    keyword = error.validator
    path = tuple(error.absolute_path)
    if keyword == "type" and not path:
        return Refused("schema", "not_an_object", "This answer could not be read: its content is not a JSON object.")
    if keyword == "required":
        return _missing_field(error)
    if keyword == "type":
        expected = error.validator_value
        return Refused(
            "schema", "wrong_type", f"The answer's `{_field(error)}` should be {_a(expected)}, and it is not."
        )
    if keyword in ("const", "enum", "minimum"):
        return Refused("schema", "wrong_value", _wrong_value_message(error))
    if keyword == "minLength":
        return Refused("schema", "too_short", f"The answer's `{_field(error)}` is empty.")
    if keyword == "maxLength":
        # The words a person typed (a reply is read into ``text``, a remark
        # into ``note``) are told in theirs: Element shows the field's
        # backticks as they are, and the count says how much to cut.
        what = {"text": "Your answer", "note": "Your note"}.get(_field(error))
        if what is not None and isinstance(error.instance, str):
            return Refused("schema", "too_long", f"{what} is {len(error.instance)} characters long; the bridge takes "
                                                 f"at most {error.validator_value}. Shorten it and send it again.")
        return Refused(
            "schema",
            "too_long",
            f"The answer's `{_field(error)}` is longer than {error.validator_value} characters.",
        )
    if keyword == "anyOf" and not path:
        return Refused(
            "schema", "no_answer", "This answer is empty: it picks no option and has no text. Pick an option or write an answer."
        )
    return Refused("schema", "invalid_content", f"The answer's `{_field(error)}` does not fit the answer format.")


def _missing_field(error: ValidationError) -> Refused:
    instance = error.instance if isinstance(error.instance, dict) else {}
    missing = next((name for name in error.validator_value if name not in instance), "?")
    field = _field(error, missing)
    if field == "m.relates_to":
        message = "This answer does not say which question it answers: it has no `m.relates_to` reference."
    else:
        message = f"This answer is missing `{field}`."
    return Refused("schema", "missing_field", message)


def _wrong_value_message(error: ValidationError) -> str:
    field = _field(error)
    if error.validator == "const":
        return f"The answer's `{field}` must be {json.dumps(error.validator_value)}."
    if error.validator == "minimum":
        return f"The answer's `{field}` must be at least {error.validator_value}."
    return f"The answer's `{field}` has a value this bridge does not know."


def _a(expected: Any) -> str:
    names = {"object": "an object", "string": "a string", "integer": "a whole number", "array": "a list"}
    if isinstance(expected, str):
        return names.get(expected, expected)
    return " or ".join(names.get(str(e), str(e)) for e in expected)


# --------------------------------------------------------------------------
# recorded layer


def check_recorded(question: RecordedQuestion | None, answer: IncomingAnswer, ctx: JudgeContext) -> Accepted | Refused:
    """The recorded layer, on a content the schema layer has passed."""
    content: dict[str, Any] = answer.content
    refusal = _check_identity(question, answer, ctx)
    if refusal is not None:
        return refusal
    assert question is not None  # _check_identity refuses None
    refusal = _check_subject(question, content.get("subject"))
    if refusal is not None:
        return refusal
    text = content.get("text")
    if text is not None and len(text) > question.text_max:
        return Refused(
            "recorded",
            "text_too_long",
            f"Your answer is {len(text)} characters long; this question takes at most {question.text_max}.",
        )
    option_id = content.get("option_id")
    if option_id is not None:
        return _judge_option(question, answer, option_id, text)
    return _judge_text_only(question, answer, text)


def check_identity(question: RecordedQuestion | None, answer: IncomingAnswer, ctx: JudgeContext) -> Refused | None:
    """The recorded layer's identity checks alone, for what rides on an answer
    without being one (a note, a file): same question, room, sender, openness.
    ``answer.content`` must carry ``m.relates_to.event_id`` and ``elicitation_id``."""
    try:
        return _check_identity(question, answer, ctx)
    except Exception:  # noqa: BLE001 - same contract as judge: never raises
        return _unjudgeable("recorded")


def _check_identity(question: RecordedQuestion | None, answer: IncomingAnswer, ctx: JudgeContext) -> Refused | None:
    """Is this an answer, by someone who may answer, to this posting of an open question?"""
    content = answer.content
    sender = answer.sender
    if sender == ctx.bridge_user:
        return Refused("recorded", "from_bridge", "The bridge does not answer its own questions.")
    if question is None or question.qid is None:
        return Refused(
            "recorded",
            "unknown_question",
            "This answer refers to a message that is not a question the bridge asked.",
        )
    if content["m.relates_to"]["event_id"] != question.event_id:
        return Refused("recorded", "wrong_reference", "This answer refers to a different message than this question.")
    if answer.room_id != question.room_id:
        return Refused("recorded", "wrong_room", "Answer this question in the room where it was asked.")
    # A question closed for good is closed to everyone, and says so first:
    # who may answer is not known for every room (a room the config no
    # longer names, once its last question closed, has its members unread).
    if not question.open and question.closed_why not in KEEPS_TAKING:
        return closed_refusal(question)
    if not _may_answer(sender, ctx):
        return Refused("recorded", "sender_not_allowed", "You are not one of the people who may answer this question.")
    if not question.may_answer_at(sender, answer.origin_server_ts):
        people = question.answerers_at(answer.origin_server_ts)
        escalation = question.escalation
        later = (f" It is called in to you at {clock_words(escalation[0])} ({format_rfc3339(escalation[0])}); "
                 "answer from then on.") if escalation is not None and sender in escalation[1] else ""
        return Refused("recorded", "not_an_answerer",
                       f"Only {_people(people)} may answer this question, so your answer was not recorded.{later}")
    if content["elicitation_id"] != question.elicitation_id:
        return Refused(
            "recorded",
            "wrong_elicitation",
            "This answer was made for another posting of this question. Answer the latest one.",
        )
    # Time is the room's: an answer the timeline places at or after the
    # deadline is late, whenever the bridge reads it; one placed before it
    # counts even when the bridge closed the question in between.
    expires = question.expires_ms
    if expires is not None and answer.origin_server_ts >= expires:
        # (A question its quorum decided before the deadline never expired:
        # said so, as its message and its thread say it.)
        what = "was decided before its deadline," if question.closed_why == CLOSED_DECIDED else "expired at"
        return Refused("recorded", "expired",
                       f"This question {what} {clock_words(expires)} ({format_rfc3339(expires)}); "
                       "answers after that are not recorded.")
    return None


def closed_refusal(question: RecordedQuestion, what: str = "the answer was not recorded") -> Refused:
    """A question closed for good: ``what`` of what was sent (a note or a
    file is no answer, and is told as what it is)."""
    # ("closed" alone says nothing "no longer open" does not.)
    why = f" ({why_in_brackets(question.closed_why)})" if question.closed_why and question.closed_why != "closed" else ""
    return Refused("recorded", "question_closed", f"This question is no longer open{why}, so {what}.")


def poll_ended_refusal(by: str, at_ms: int) -> Refused:
    """A vote the room placed after the question's poll was ended (by the
    poll's sender or someone with the power to): clients count it nowhere,
    so neither does the bridge.  The question itself may still be open."""
    return Refused("recorded", "poll_ended",
                   f"This poll was ended by {by} at {clock_words(at_ms)}, so your vote was not recorded. "
                   "You can still answer by replying to the question.")


# Why a question was closed when its postings still take what the room placed
# in time: it expired (answers from before the deadline count), or its quorum
# decided it (votes are kept; they do not change the decision).
CLOSED_EXPIRED = "expired"
CLOSED_DECIDED = "decided"
KEEPS_TAKING = (CLOSED_EXPIRED, CLOSED_DECIDED)


def _people(people: list[str]) -> str:
    if not people:
        return "the people the question names"
    if len(people) == 1:
        return people[0]
    return ", ".join(people[:-1]) + " or " + people[-1]


def _may_answer(sender: Any, ctx: JudgeContext) -> bool:
    if not isinstance(sender, str):
        return False
    if ctx.allowed is not None:
        return sender in ctx.allowed
    return sender in ctx.members


def _check_subject(question: RecordedQuestion, binding: Any) -> Refused | None:
    """A subject-bound question takes only an answer bound to exactly its subject."""
    if not question.subject_bound:
        if binding is not None:
            return Refused(
                "recorded",
                "unexpected_subject",
                "This answer approves a specific item, but the question is not about one.",
            )
        return None
    if binding is None:
        return Refused(
            "recorded",
            "subject_missing",
            "This question approves one specific item, and the answer does not say which one it approves.",
        )
    own = question.subject
    if own is None or binding["id"] != own[0]:
        return Refused("recorded", "wrong_subject", "This answer is about a different item than the question asks about.")
    if binding["digest"] != own[1]:
        return Refused(
            "recorded",
            "wrong_digest",
            "The item has changed since you saw it (its digest differs), so this answer was not recorded.",
        )
    return None


def _judge_option(question: RecordedQuestion, answer: IncomingAnswer, option_id: str, text: str | None) -> Accepted | Refused:
    kind = question.kind
    if option_id not in question.offered_ids or (kind == "text" and option_id != UNSURE_ID):
        return Refused("recorded", "option_not_offered", f"{_quote(option_id)} is not one of this question's options.")
    if kind in ("multi", "rank") and option_id not in BUILTIN_IDS:
        return _encoding_refusal(kind)
    if question.option_input(option_id) == "required" and _blank(text):
        label = question.label(option_id) or option_id
        return Refused("recorded", "input_required", f"{_quote(label)} needs a few words from you. Add them as text.")
    # Text beside an option that takes no input is still the person's words:
    # it is kept (as the record's note) rather than refused or dropped.
    text = None if _blank(text) else text
    note = answer.content.get("note")
    if text is not None and not _blank(note) and len(text) + len(NOTE_JOINER) + len(note) > NOTE_MAX:
        return Refused(
            "recorded",
            "note_too_long",
            f"Your text and note together are longer than {NOTE_MAX} characters. Shorten one of them.",
        )
    return _accepted(question, answer, option_id=option_id, text=text)


def _judge_text_only(question: RecordedQuestion, answer: IncomingAnswer, text: str) -> Accepted | Refused:
    """No option_id: the schema guarantees non-blank text; what it means depends on the kind."""
    kind = question.kind
    if kind == "text":
        return _accepted(question, answer, text=text)
    if kind == "multi":
        return _judge_multi(question, answer, text)
    if kind == "rank":
        return _judge_rank(question, answer, text)
    # On the single-pick kinds `text` is an option's input, never a pick by
    # itself: reading free words as "other" or as a bare note would silently
    # turn a mistyped pick into something the person did not choose.  The
    # single-pick kinds (and a kind this bridge does not know) end up here.
    own_words = _name(question, OTHER_ID) if OTHER_ID in question.offered_ids else None
    how = f" To answer in your own words, pick {own_words} and add your text." if own_words else ""
    return Refused("recorded", "option_required", "Pick one of the options." + how)


def _judge_multi(question: RecordedQuestion, answer: IncomingAnswer, text: str) -> Accepted | Refused:
    ids = _split_ids(text)
    refusal = _check_listed(question, ids, question.offered_ids - set(BUILTIN_IDS))
    if refusal is not None:
        return refusal
    if not ids:
        return Refused("recorded", "no_choices", "Pick at least one option.")
    return _accepted(question, answer, choices=tuple(ids))


def _judge_rank(question: RecordedQuestion, answer: IncomingAnswer, text: str) -> Accepted | Refused:
    ids = _split_ids(text)
    wanted = question.rankable_ids
    refusal = _check_listed(question, ids, set(wanted))
    if refusal is not None:
        return refusal
    missing = [oid for oid in wanted if oid not in ids]
    if missing:
        return Refused(
            "recorded",
            "rank_incomplete",
            "Put every option in your order. Missing: " + ", ".join(_name(question, m) for m in missing[:10]) + ".",
        )
    return _accepted(question, answer, order=tuple(ids))


def _check_listed(question: RecordedQuestion, ids: list[str], allowed: Iterable[str]) -> Refused | None:
    allowed = set(allowed)
    seen: set[str] = set()
    for oid in ids:
        if oid in BUILTIN_IDS:
            return Refused("recorded", "builtin_in_list", _builtin_in_list_message(question, oid))
        if oid not in allowed:
            return Refused("recorded", "option_not_offered", f"{_quote(oid)} is not one of this question's options.")
        if oid in seen:
            return Refused("recorded", "choice_repeated", f"{_name(question, oid)} is listed more than once.")
        seen.add(oid)
    return None


def _builtin_in_list_message(question: RecordedQuestion, oid: str) -> str:
    return f"{_name(question, oid)} can't be combined with other picks; send it on its own."


def _name(question: RecordedQuestion, oid: str) -> str:
    """An offered option as the message shows it, by its number and what it
    reads as (the side on a compare): the person may have typed "5" and
    never seen the id."""
    return option_name(question, oid)


def _encoding_refusal(kind: str) -> Refused:
    if kind == "multi":
        how = "send the ids of the options you pick as text, separated by commas (for example \"a, c\")"
    else:
        how = "send every option id as text, in your order, separated by commas"
    return Refused("recorded", "wrong_encoding", f"On this question, {how}.")


def _split_ids(text: str) -> list[str]:
    # A stray trailing comma or doubled comma is a typing slip, not a pick:
    # empty items are dropped.
    return [part.strip() for part in text.split(",") if part.strip()]


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _blank(text: str | None) -> bool:
    return text is None or not text.strip()


def _quote(value: str, limit: int = 60) -> str:
    # Ids come from the person; keep the echo short, on one line, and free of
    # control characters (a NUL would fail the refusal's write on PostgreSQL)
    # and of halves of surrogate pairs (which no store and no UTF-8 can write).
    shown = shorten(value, limit)
    return "\u201c" + "".join("\ufffd" if unicodedata.category(c) in ("Cc", "Cs") else c
                               for c in " ".join(shown.split())) + "\u201d"


def _accepted(
    question: RecordedQuestion,
    answer: IncomingAnswer,
    *,
    option_id: str | None = None,
    text: str | None = None,
    choices: tuple[str, ...] | None = None,
    order: tuple[str, ...] | None = None,
) -> Accepted:
    content = answer.content
    return Accepted(
        qid=question.qid or "",
        # question.v2 requires rev; a record without one is treated as the first revision.
        q_rev=question.rev or 1,
        option_id=option_id,
        text=text,
        choices=choices,
        order=order,
        note=None if _blank(content.get("note")) else content["note"],
        kind=question.kind,
        via=answer.via,
        event_id=answer.event_id,
        elicitation_id=content["elicitation_id"],
    )


__all__ = [
    "Accepted",
    "IncomingAnswer",
    "JudgeContext",
    "REASONS",
    "Refused",
    "check_identity",
    "check_recorded",
    "check_schema",
    "judge",
]
