"""What the bridge says back about an answer: a short notice replying to the
person's event, carrying the machine-readable outcome
(``schemas/matrix/dev.superpipeline.question.outcome.v1.json``) so agents
reading the room learn it too."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.graphemes import cut
from bridge.questionset.builtin import OTHER_ID, UNSURE_ID
from bridge.protocol.render import HTML_FORMAT, esc_links, esc_people, option_display, short_digest, shown_title
from bridge.questionset.shown import visible

OUTCOME_KEY = "dev.superpipeline.question.outcome"


def outcome_field(*, answer_event_id: str, recorded: bool, question_event_id: str | None = None,
                  qid: str | None = None, q_rev: int | None = None, via: str | None = None,
                  layer: str | None = None, reason: str | None = None,
                  record_rev: int | None = None) -> dict[str, Any]:
    field: dict[str, Any] = {
        "schema_version": 1,
        "answer_event_id": answer_event_id,
        "outcome": "recorded" if recorded else "refused",
        "layer": None if recorded else layer,
        "reason": None if recorded else reason,
    }
    optional = {"question_event_id": question_event_id, "qid": qid, "q_rev": q_rev, "via": via,
                "record_rev": record_rev if recorded else None}
    field.update({k: v for k, v in optional.items() if v is not None})
    return field


def describe_record(record: dict[str, Any], labels: Mapping[str, str] | None = None) -> str:
    """The pick in a few words, as the person would recognise it.

    A record holds option ids, which the person never saw: ``labels``
    (option id -> what the message showed for it, ``display_names``) turns
    them back into the words of the message; an id it lacks is shown as is.
    """
    if record.get("state") == "unsure":
        return "not sure yet"
    named = labels or {}
    if "label" in record:
        picked = shown_title(named.get(str(record.get("choice")), record["label"]))
    elif "choices" in record:
        picked = ", ".join(shown_title(named.get(c, c)) for c in record["choices"])
    elif "order" in record:
        picked = " > ".join(shown_title(named.get(c, c)) for c in record["order"])
    elif "text" in record:
        # Without the invisible characters that turn a line around (a U+202E
        # in an answer reversed the bridge's own words after it for everyone).
        text = visible(str(record["text"]))
        picked = f"“{cut(text, 80)}{'…' if len(text) > 80 else ''}”"
    else:
        picked = _kept(record)
    if record.get("note") and record.get("state") != "note_only":
        picked += " (with a note)"
    return picked


def _kept(record: dict[str, Any]) -> str:
    """What a record with no pick holds: its files, its note, or both."""
    files = len(record.get("attachments") or ())
    said = "a file" if files == 1 else f"{files} files" if files else ""
    if (record.get("note") or "").strip() or record.get("timecodes") or not said:
        return f"a note and {said}" if said else "a note"
    return said


def display_names(question: RecordedQuestion) -> dict[str, str]:
    """Option id -> what the person read for it in the question's message.

    On a compare the sided options read as their side ("Right"); the label
    behind a side is added only when the sides are not blind (not
    ``randomized``), so an acknowledgement never names what the person did
    not see.
    """
    sides = question.question.get("sides")
    blind = isinstance(sides, dict) and sides.get("randomized") is True
    names = {}
    for option in question.options:
        shown = option_display(question.question, option)
        label = option.get("label")
        if shown != label and isinstance(label, str) and not blind:
            shown = f"{shown} ({label})"
        names[option["id"]] = shown
    return names


def option_numbers(question: RecordedQuestion) -> dict[str, int]:
    """Option id -> the number the question's message showed for it."""
    return {str(o.get("id")): i for i, o in enumerate(question.options, start=1)}


# Answers whose word back sits under a quote of the person's message.
QUOTED_VIAS = frozenset({"reply", "edit"})


def numbers_read(record: Mapping[str, Any], numbers: Mapping[str, int]) -> str | None:
    """"option 2", "options 1, 3", "order 3, 1, 2": the pick by the numbers
    the message showed, or None (a text, a built-in, an id not numbered).

    Element quotes a message as its latest edit: under a quoted "3" an
    earlier "Recorded: Some risk" read as if the bridge misread the 3.
    Named by number, the word back says what it read, whatever the quote
    shows now.
    """
    if record.get("state") == "unsure":
        return None
    if "choice" in record:
        ids, one, many = [record["choice"]], "option", "options"
    elif "choices" in record:
        ids, one, many = list(record["choices"]), "option", "options"
    elif "order" in record:
        ids, one, many = list(record["order"]), "order", "order"
    else:
        return None
    if not ids or any(i in (UNSURE_ID, OTHER_ID) or str(i) not in numbers for i in ids):
        return None
    return f"{one if len(ids) == 1 else many} " + ", ".join(str(numbers[str(i)]) for i in ids)


def sentence(text: str) -> str:
    """``text`` ended with one full stop: none added after a closing quote or
    a mark that already ends it (no “fine.”. or ?.)."""
    text = text.rstrip()
    bare = text.rstrip("”\"'’")
    return text if bare.endswith((".", "!", "?", "…")) else text + "."


def notice(text: str, reply_to: str, outcome: dict[str, Any]) -> dict[str, Any]:
    # Everything is escaped; a pick that looks like a Matrix id or a URL is
    # shown as code, so Element does not turn the person's answer into a pill
    # or a link somewhere else.
    return {
        "msgtype": "m.notice",
        "body": text,
        "format": HTML_FORMAT,
        "formatted_body": esc_links(text),
        "m.relates_to": {"m.in_reply_to": {"event_id": reply_to}},
        "m.mentions": {},
        OUTCOME_KEY: outcome,
    }


# Whose answer stood before an accepted one (``recorded_notice``).
OWN, OTHER = "own", "other"


def recorded_notice(*, answer_event_id: str, question_event_id: str, record: dict[str, Any], title: str,
                    via: str | None, extra: str | None = None, labels: Mapping[str, str] | None = None,
                    reply_to: str | None = None, subject: tuple[str, str] | None = None,
                    replaced: int = 0, stood_before: str | None = None,
                    numbers: Mapping[str, int] | None = None, edited_counted: bool = True) -> dict[str, Any]:
    """The word back on an accepted answer.

    ``replaced``: earlier answers to the same question this one reply also
    stands for (answers sent while the bridge was away get one reply, for
    the answer that stands).  ``stood_before``: whose answer the record held
    just before this one, ``OWN`` or ``OTHER`` (None: no answer stood, the
    first one or the last one withdrawn), as the room's timeline has it.

    ``reply_to`` is the message the person sees (for an edit, the original:
    clients hide the edit event itself).  ``record`` is the record as
    ``answers.json`` holds it after this answer, so the words and
    ``record_rev`` say what the file says.  ``subject`` (id, digest) names
    what an approval approved.  ``numbers`` (option id -> number shown,
    ``option_numbers``): given for a reply or an edit, whose word back sits
    under a quote of the message, the pick is named by number too.
    ``edited_counted``: for an edit, whether the message it edits had
    counted as the person's answer; one refused or unread is no answer to
    change, and the edit is told as a first answer.
    """
    title = shown_title(title)
    picked = describe_record(record, labels)
    read = numbers_read(record, numbers) if numbers is not None and via in QUOTED_VIAS else None
    if read is not None:
        noted = " (with a note)"
        picked = (picked[: -len(noted)] + f" ({read}, with a note)" if picked.endswith(noted)
                  else picked + f" ({read})")
    if subject is not None:
        picked += f", for {shown_title(subject[0])} (digest {short_digest(subject[1])})"
    if via == "edit" and edited_counted:
        text = sentence(f"Changed your answer to “{title}”: now {picked}")
        if stood_before == OTHER:
            # An edit is a new answer: of an old one, it replaces whatever stood since, another's too.
            text += " This replaces the answer someone else gave."
    else:
        text = sentence(f"Recorded for “{title}”: {picked}")
        if replaced:
            text += f" This replaces {replaced} earlier answer{'s' if replaced > 1 else ''} you sent meanwhile."
        elif stood_before == OWN:
            text += " This replaces your earlier answer."
        elif stood_before == OTHER:
            text += " This replaces the answer someone else gave."
    if extra:
        text += f" {extra}"
    return notice(text, reply_to or answer_event_id, outcome_field(
        answer_event_id=answer_event_id, recorded=True, question_event_id=question_event_id,
        qid=record.get("qid"), q_rev=record.get("q_rev"), via=via, record_rev=record.get("rev")))


def refused_notice(*, answer_event_id: str, question_event_id: str | None, qid: str | None, layer: str,
                   reason: str, message: str, via: str | None, reply_to: str | None = None) -> dict[str, Any]:
    text = sentence(f"Not recorded: {message}")
    return notice(text, reply_to or answer_event_id, outcome_field(
        answer_event_id=answer_event_id, recorded=False, question_event_id=question_event_id, qid=qid,
        via=via, layer=layer, reason=reason))


def txn_id(*parts: str) -> str:
    """A transaction id derived from what is sent, so a retry after a crash is
    deduplicated by the homeserver instead of posting twice."""
    return "awb" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]


def in_thread(question_event_id: str) -> dict[str, Any]:
    """An ``m.relates_to`` that puts a message in the question's thread.

    Clients without threads show it as a reply to the question (the fallback).
    """
    return {"rel_type": "m.thread", "event_id": question_event_id, "is_falling_back": True,
            "m.in_reply_to": {"event_id": question_event_id}}


def describe_added(added: dict[str, Any]) -> str:
    """What a note message added, in a few words ("a note, 2 timecodes, 1 file")."""
    bits: list[str] = []
    if added.get("note"):
        bits.append("a note")
    for key, one, many in (("timecodes", "timecode", "timecodes"), ("attachments", "file", "files")):
        count = len(added.get(key) or ())
        if count:
            bits.append(f"{count} {one if count == 1 else many}")
    return ", ".join(bits) or "nothing"


def annotated_notice(*, answer_event_id: str, question_event_id: str, added: dict[str, Any], title: str, qid: str,
                     q_rev: int, record_rev: int, picked: bool = True, whose: str | None = None,
                     edited: bool = False) -> dict[str, Any]:
    """``picked``: an answer stands that the note is added to; before any,
    the note is kept for the pick to come (there is no answer to add it to).
    ``whose``: who gave that answer, when it is not the person noting.
    ``edited``: the note is an edit of one kept before, which it replaces."""
    title = shown_title(title)
    what = describe_added(added)
    if picked:
        answer = f"the answer {whose} gave to “{title}”" if whose else f"your answer to “{title}”"
        text = sentence(f"Changed what you added to {answer}, now: {what}" if edited else f"Added to {answer}: {what}")
    else:
        kept = f"Kept, as changed, for “{title}”" if edited else f"Kept for “{title}”"
        text = sentence(f"{kept}: {what}") + " It goes with your answer once you pick one."
    return notice(text, answer_event_id, outcome_field(
        answer_event_id=answer_event_id, recorded=True, question_event_id=question_event_id, qid=qid, q_rev=q_rev,
        record_rev=record_rev))


def coalesced(content: dict[str, Any], more: int) -> dict[str, Any]:
    """A refusal that also stands for ``more`` earlier refusals of the same
    person about the same question, sent as one reply (a flood of replies
    gets a handful of answers, not one each)."""
    if more <= 0:
        return content
    return with_remark(content, f"({more} more of your messages about this were not recorded either.)")


def addressed(content: dict[str, Any], person: str) -> dict[str, Any]:
    """``content`` opening with whom it is for: a word back in the question's
    thread that quotes nothing of theirs (a vote, a reaction) would otherwise
    leave everyone there guessing whose "your" it means.  Named, not
    mentioned: ``m.mentions`` stays empty, so nobody is pinged."""
    return {**content, "body": f"{person}: " + content["body"],
            "formatted_body": esc_people(f"{person}: ", [person]) + content.get("formatted_body", "")}


def in_thread_reply(question_event_id: str, event_id: str) -> dict[str, Any]:
    """An ``m.relates_to`` that replies to ``event_id`` inside the question's thread."""
    return {**in_thread(question_event_id), "is_falling_back": False, "m.in_reply_to": {"event_id": event_id}}


def with_remark(content: dict[str, Any], remark: str, people: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """``content`` with a sentence added to its text; ``people``: user ids the
    bridge names in it, shown as pills (as the decision's announcement shows
    them), where anything else id-like stays code."""
    extra = " " + remark
    return {**content, "body": content["body"] + extra,
            "formatted_body": content.get("formatted_body", "") + esc_people(extra, people)}
