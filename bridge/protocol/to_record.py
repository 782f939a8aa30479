"""An accepted answer -> its ``answers.json`` record.

Pure: the caller hands in the record it replaces (``prior``), where the
answer came from (``source``) and the time (``now``).  The record follows
docs/architecture.md ("answers.json"): one pick field by kind, the note, the
revision the person answered and how many answers the question has had.
"""

from __future__ import annotations

from typing import Any

from bridge.protocol.judge import NOTE_JOINER, Accepted
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.builtin import UNSURE_ID


def to_record(
    question: RecordedQuestion,
    accepted: Accepted,
    *,
    prior: dict[str, Any] | None,
    source: dict[str, Any],
    now: str,
) -> dict[str, Any]:
    """The record of ``accepted`` as the answer to ``question``, replacing ``prior``."""
    record: dict[str, Any] = {"qid": accepted.qid, "state": _state(accepted)}
    record.update(_pick_fields(question, accepted))
    matched = matched_guess(question.guess, accepted)
    if matched is not None:
        record["matched_guess"] = matched
    revealed = _guess_revealed(question.guess)
    if revealed is not None:
        record["guess_revealed_before_pick"] = revealed
    note = answer_note(accepted)
    if note is None and prior is not None:
        note = _kept_note(question, prior)
    if note is not None:
        record["note"] = note
    record.update(_kept_files(prior))
    if question.subject is not None:
        # What the person approved: the judge accepted only an answer bound to exactly this.
        record["subject"] = {"id": question.subject[0], "digest": question.subject[1]}
    record["q_rev"] = accepted.q_rev
    record["rev"] = _prior_rev(prior) + 1
    record["updated"] = now
    record["source"] = dict(source)
    return record


def answer_note(accepted: Accepted) -> str | None:
    """The note this answer brings: an option's input text, then the ``note`` extension.

    Beside an option, ``text`` is that option's input (askwright keeps it as
    the note); the judge has already refused a note that would not fit.
    """
    parts = []
    if accepted.option_id is not None and accepted.text:
        parts.append(accepted.text)
    if accepted.note:
        parts.append(accepted.note)
    return NOTE_JOINER.join(parts) if parts else None


def matched_guess(guess: dict[str, Any] | None, accepted: Accepted) -> bool | None:
    """Whether the pick is the agent's guess as posted; None when there was no guess."""
    if guess is None:
        return None
    if accepted.choices is not None:
        wanted = guess.get("options")
        return isinstance(wanted, list) and set(wanted) == set(accepted.choices)
    if accepted.order is not None:
        wanted = guess.get("order")
        return isinstance(wanted, list) and tuple(wanted) == accepted.order
    if accepted.option_id is not None:
        return guess.get("option") == accepted.option_id
    if accepted.text is not None:
        wanted = guess.get("text")
        return isinstance(wanted, str) and _words(wanted) == _words(accepted.text)
    return False


def _state(accepted: Accepted) -> str:
    if accepted.option_id == UNSURE_ID:
        return "unsure"
    if accepted.option_id is not None or accepted.choices or accepted.order or accepted.text is not None:
        return "answered"
    return "note_only"


def _pick_fields(question: RecordedQuestion, accepted: Accepted) -> dict[str, Any]:
    if accepted.option_id is not None:
        fields: dict[str, Any] = {"choice": accepted.option_id}
        label = question.label(accepted.option_id)
        if label is not None:
            fields["label"] = label
        side = question.side_of(accepted.option_id) if question.kind == "compare" else None
        if side is not None:
            fields["side"] = side
        return fields
    if accepted.choices is not None:
        return {"choices": list(accepted.choices)}
    if accepted.order is not None:
        return {"order": list(accepted.order)}
    if accepted.text is not None:
        return {"text": accepted.text}
    return {}


def _guess_revealed(guess: dict[str, Any] | None) -> bool | None:
    # The question message shows a high-confidence guess outright and hides a
    # low one behind a spoiler.  Matrix does not report a spoiler being
    # opened, so for a low guess the answer is unknown and left out rather
    # than claimed either way.
    if guess is None:
        return False
    if guess.get("confidence") == "high":
        return True
    return None


def _kept_note(question: RecordedQuestion, prior: dict[str, Any]) -> str | None:
    # A new pick without words keeps the person's earlier note: it is their
    # data, and a changed mind about the pick rarely retracts the remark.
    # Not so when the earlier note was the input of the option picked then
    # (e.g. "other: run only the unit tests"): that text explained that pick
    # and would misdescribe the new one.
    note = prior.get("note")
    if not isinstance(note, str) or not note:
        return None
    earlier = prior.get("choice")
    if isinstance(earlier, str) and question.option_input(earlier) is not None:
        return None
    return note


def _kept_files(prior: dict[str, Any] | None) -> dict[str, Any]:
    # An answer event carries no files or timecodes, so those the person
    # sent earlier (stored in the set folder) stay with the record.
    if prior is None:
        return {}
    kept: dict[str, Any] = {}
    for key in ("attachments", "timecodes"):
        value = prior.get(key)
        if isinstance(value, list) and value:
            kept[key] = list(value)
    return kept


def _prior_rev(prior: dict[str, Any] | None) -> int:
    rev = prior.get("rev") if prior is not None else None
    return rev if isinstance(rev, int) and not isinstance(rev, bool) and rev > 0 else 0


def _words(text: str) -> str:
    return " ".join(text.split()).casefold()
