"""The word back on a withdrawal, and on a reply the bridge can't place.

Pure.  A withdrawal (a removed answer, vote, reaction or note; an empty
poll vote) changes the record as surely as an answer does, so it is told
too: what was withdrawn and what the record holds now.  The message goes
where the acknowledgement of what was withdrawn went (a reply to it), so
the person sees the two side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.protocol.outcome import describe_record, notice, sentence, shown_title

WITHDRAWN_KEY = "dev.superpipeline.question.withdrawn"

# What the person did, by the `via` the bridge logged for it.
_GESTURE = {"poll": "vote", "reaction": "reaction", "note": "note", "attachment": "file"}


def gesture(via: str | None) -> str:
    return _GESTURE.get(via or "", "answer")


def withdrawn_text(*, title: str, withdrawn_via: str | None, now: dict[str, Any] | None,
                   labels: Mapping[str, str] | None = None, vote: bool = False, by: str | None = None,
                   again: bool = True, stood: bool = False, own_vote: tuple[str, str] | None = None) -> str:
    """``vote``: a quorum question's vote (PROTOCOL 2a), whose record holds
    everyone's votes: only the head is said (the caller adds where they
    stand), and ``own_vote`` (how it was given, its pick): another vote of
    the same person that counts now, theirs again (``again``) or still.
    ``by``: who withdrew it, so an answer of someone else's that stands is
    not called theirs; ``again``: the answer standing now stood before what
    was withdrawn (False: what was withdrawn had not stood, and nothing changed);
    ``stood``: what was withdrawn stood when its question's deadline closed
    it, and still stands (``now``)."""
    # An edit taken back brings back what it replaced: said as an edit, so
    # the answer standing again is not read as withdrawn with it.
    what = "vote" if vote else "edit" if withdrawn_via == "edit" else gesture(withdrawn_via)
    title = shown_title(title)
    if stood and now is not None:
        return sentence(f"Your {what} to “{title}” stood at the deadline; withdrawing it now does not change "
                        f"that: {describe_record(now, labels)} stands")
    head = f"Your {what} on “{title}” is withdrawn" if what in ("note", "file") else \
        f"Your {what} to “{title}” is withdrawn"
    if vote:
        if own_vote is not None:
            how, pick = own_vote
            return sentence(f"{head}; your {'earlier ' if again else ''}{gesture(how)}, “{pick}”, counts as your "
                            f"vote {'again' if again else 'still'}")
        return f"{head}."
    if now is None:
        return f"{head}; no answer is recorded now."
    sender = (now.get("source") or {}).get("sender")
    own = by is None or sender in (None, by)
    if now.get("state") == "note_only":
        if what == "edit":
            return sentence(f"{head}; {'what you' if own else f'what {sender}'} sent before it stands: "
                            f"{describe_record(now, labels)}")
        return f"{head}; no answer is recorded now, only {'your notes' if own else 'notes'}."
    earlier = gesture((now.get("source") or {}).get("how"))
    standing = describe_record(now, labels)
    if what in ("note", "file"):
        return sentence(f"{head}; {f'your {earlier}' if own else f'the {earlier} {sender} gave'} stands: {standing}")
    whose = (f"your earlier {earlier}" if again else f"your {earlier}") if own else f"the {earlier} {sender} gave"
    return sentence(f"{head}; {whose}, {standing}, {'stands again' if again else 'still stands'}")


def withdrawn_notice(*, event_id: str, withdrawn_event_id: str | None, question_event_id: str | None,
                     qid: str | None, title: str, withdrawn_via: str | None, now: dict[str, Any] | None,
                     reply_to: str, labels: Mapping[str, str] | None = None, vote: bool = False,
                     by: str | None = None, again: bool = True, stood: bool = False,
                     own_vote: tuple[str, str] | None = None) -> dict[str, Any]:
    """``event_id``: the redaction (or empty vote); ``now``: the record as
    ``answers.json`` holds it after the withdrawal (None: no record)."""
    content = notice(withdrawn_text(title=title, withdrawn_via=withdrawn_via, now=now, labels=labels, vote=vote,
                                    by=by, again=again, stood=stood, own_vote=own_vote), reply_to, {})
    content.pop("dev.superpipeline.question.outcome", None)
    content[WITHDRAWN_KEY] = {
        "schema_version": 1,
        "event_id": event_id,
        "withdrawn_event_id": withdrawn_event_id,
        "question_event_id": question_event_id,
        "qid": qid,
        "record_rev": now.get("rev") if now else None,
        "state": now.get("state") if now else None,
    }
    return content


UNPLACED_MESSAGE = ("I couldn't tell which question this reply is about. Reply to the question itself "
                    "(or to my message about your answer) with the number of your pick.")


def unplaced_message(about: tuple[str, str] | None) -> str:
    """The word on a reply the bridge can't place; ``about``: (the question's
    title, whose answer) when it replies to someone else's answer: the bridge
    knows the question, and says why the reply is not taken as an answer."""
    if about is None:
        return UNPLACED_MESSAGE
    title, whose = about
    title = shown_title(title)
    return (f"This replies to {whose}'s answer to “{title}”, so it is not taken as yours. "
            "To answer it yourself, reply to the question itself with the number of your pick.")
