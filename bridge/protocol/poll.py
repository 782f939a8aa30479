"""A question's native poll: the start and end events Element renders.

Pure.  Element renders a poll whose event type and content key are both
``org.matrix.msc3381.poll.start`` (PROTOCOL section 3); the stable ``m.poll``
key shows as an empty tile, so the MSC names are used throughout.  Answer
ids are the option ids, so a vote is read with no table of its own.
"""

from __future__ import annotations

from typing import Any

from bridge.protocol.deadline import clock_words
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.render import gets_poll, option_display, poll_answers, short_digest, shorten
from bridge.questionset.shown import visible

POLL_START = "org.matrix.msc3381.poll.start"
POLL_END = "org.matrix.msc3381.poll.end"
TEXT = "org.matrix.msc1767.text"
DISCLOSED = "org.matrix.msc3381.poll.disclosed"
POLL_KEY = "dev.superpipeline.question.poll"

_LABEL_MAX = 200
_QUESTION_MAX = 1000


def poll_start(question: RecordedQuestion) -> dict[str, Any] | None:
    """The poll for a posted question, or None when it can't have one."""
    if not gets_poll(question.kind, question.options):
        return None
    q = question.question
    asked = _asked(question)
    # What the person reads in the poll is what the question message shows
    # (on a compare, "Left"/"Right" rather than the take names).
    answers = [{"id": o["id"], TEXT: shorten(option_display(q, o), _LABEL_MAX)} for o in poll_answers(question.options)]
    fallback = asked + "\n" + "\n".join(f"{n}. {a[TEXT]}" for n, a in enumerate(answers, start=1))
    return {
        POLL_START: {
            "kind": DISCLOSED,
            "max_selections": 1,
            "question": {TEXT: asked, "body": asked, "msgtype": "m.text"},
            "answers": answers,
        },
        TEXT: fallback,
        "body": fallback,
        POLL_KEY: {"question_event_id": question.event_id, "qid": question.qid,
                   "elicitation_id": question.elicitation_id},
        # The question's message already mentions whom it asks; the poll beside it pings nobody.
        "m.mentions": {},
    }


def _asked(question: RecordedQuestion) -> str:
    """The poll's question: title and question, and on an approval what is
    approved.  The poll is its own event in the timeline, seen apart from the
    message that names the subject, so a vote must not be able to approve
    something the voter did not see named; the subject is kept whole and the
    question shortened around it."""
    q = question.question
    asked = f"{q.get('title', '')}: {q.get('question', '')}"
    if question.subject is None:
        return shorten(asked, _QUESTION_MAX)
    subject_id, digest = question.subject
    suffix = f" — approving {shorten(visible(subject_id), _QUESTION_MAX // 2)} (digest {short_digest(digest)})"
    return shorten(asked, _QUESTION_MAX - len(suffix)) + suffix


def poll_end(poll_event_id: str, why: str) -> dict[str, Any]:
    """The poll's end, saying why in the words of the question's closing line
    (``why``: "withdrawn", "decided: “Ship it” by @ana and @bo", "expired
    undecided at 14:00 UTC: …"), made a sentence of its own."""
    words = why.strip() or "closed"
    text = f"The poll has ended. {words[:1].upper()}{words[1:]}"
    return _end(poll_event_id, text if text.rstrip("\u201d\"'\u2019").endswith((".", "!", "?", "\u2026"))
                else text + ".")


def deadline_poll_end(poll_event_id: str, expires_ms: int) -> dict[str, Any]:
    """The poll's end handed to the homeserver at posting, sent at the deadline
    whatever stood then: it says only what is true whenever it is sent (the
    question's closing edit, restated as votes come, says what stood)."""
    return _end(poll_event_id, f"The poll has ended at its deadline, {clock_words(expires_ms)}.")


def _end(poll_event_id: str, text: str) -> dict[str, Any]:
    # It pings nobody: the user ids it may name would otherwise set off the
    # homeserver's legacy rule that matches them in the body.
    return {
        "m.relates_to": {"rel_type": "m.reference", "event_id": poll_event_id},
        POLL_END: {},
        TEXT: text,
        "body": text,
        "m.mentions": {},
    }
