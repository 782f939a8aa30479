"""Any Matrix event -> the answer it means (or a withdrawal, a note, or nothing).

Every way of answering becomes one ``question.answer.v2`` content so the
judge sees one shape (PROTOCOL section 3): an answer event, a vote in the
question's poll (both the MSC3381 and the stable format), a reply to the
question or a message in its thread, a keycap reaction, an edit of any of
these.  What is not a pick but belongs to an answer (a remark in the thread,
a picture, a timecode) becomes an ``Annotation``; a reply that can't be read
becomes ``Unreadable`` so the person is told what works.

Pure: the few facts it needs from the past (which event is a question or a
poll, what an earlier event answered, which file a person's picture was
saved as) come through ``Lookup``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Protocol

from bridge.protocol.outcome import shown_title
from bridge.protocol.fit import timestamp
from bridge.protocol.judge import IncomingAnswer
from bridge.protocol.notes import parse_note
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.graphemes import shorten
from bridge.protocol.render import SINGLE_PICK_KINDS
from bridge.protocol.replies import Pick, help_text, keycap_number, keycap_pick, numbers_out_of_range, read_reply, valid_numbers
from bridge.questionset.builtin import BUILTIN_IDS
from bridge.questionset.shown import visible

ANSWER_TYPE = "dev.superpipeline.question.answer.v2"
POLL_RESPONSE_TYPES = frozenset({"org.matrix.msc3381.poll.response", "m.poll.response"})
POLL_END_TYPES = frozenset({"org.matrix.msc3381.poll.end", "m.poll.end"})
FILE_MSGTYPES = frozenset({"m.image", "m.file", "m.video", "m.audio"})
# What a person types (a notice is never read: ``_is_notice``).
TEXT_MSGTYPES = frozenset({"m.text", "m.emote"})


def is_file_content(content: Any) -> bool:
    """Content sending a file.  (A msgtype that is a list or an object, which
    a homeserver passes on in a custom event, was looked up in the set as it
    was: unhashable, a TypeError outside any one event's guard, and the
    batch, every transaction after it too, failed for good.)"""
    return isinstance(content, dict) and _s(content, "msgtype") in FILE_MSGTYPES


class Lookup(Protocol):
    def question_by_event(self, event_id: str) -> RecordedQuestion | None: ...
    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None: ...
    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None: ...
    def answer_reference(self, event_id: str) -> str | None:
        """The question event an earlier accepted answer referred to."""

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        """(question event id, via) the bridge logged for an earlier event, whatever came of it."""

    def has_answered(self, question: RecordedQuestion, sender: str) -> bool:
        """Whether ``sender``'s answer to the question stands."""

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        """(saved path, problem) of a file a person sent; None when it was never fetched."""

    def reply_target(self, event_id: str) -> tuple[str, str | None] | None:
        """What a reply to ``event_id`` is about: (question event id, sender) when
        it is a person's earlier gesture at a question, (question event id,
        None) when it is one of the bridge's own messages about a question."""


@dataclass(frozen=True)
class Candidate:
    answer: IncomingAnswer
    question: RecordedQuestion | None
    replaces: str | None = None  # an edit: the event it replaces


@dataclass(frozen=True)
class Withdrawal:
    """The event ``target`` (an answer, a vote, a reaction, a note) was redacted."""

    target: str
    event_id: str
    room_id: str
    sender: str


@dataclass(frozen=True)
class VoteWithdrawal:
    """An empty poll vote: the sender takes back their vote."""

    question: RecordedQuestion
    event_id: str
    room_id: str
    sender: str


@dataclass(frozen=True)
class Unreadable:
    """A gesture at a question that can't be read as an answer; nothing is recorded."""

    answer: IncomingAnswer
    question: RecordedQuestion
    message: str
    reason: str = "unreadable_reply"
    replaces: str | None = None  # an edit: the message it edits (which clients show)


@dataclass(frozen=True)
class Annotation:
    """Words, files or timecodes the person added to their answer."""

    event_id: str
    room_id: str
    sender: str
    ts: int
    question: RecordedQuestion
    via: str  # note | attachment | edit
    note: str | None = None
    attachments: tuple[str, ...] = ()
    timecodes: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    problem: str | None = None  # a file that could not be kept: its reason code
    replaces: str | None = None
    filename: str | None = None  # the file's name as sent, for the word back about it


@dataclass(frozen=True)
class PollEnd:
    """Someone ended a question's poll (MSC3381: its sender, or anyone with
    the power to redact it, may): clients count no vote after it."""

    question: RecordedQuestion
    event_id: str
    room_id: str
    sender: str
    ts: int


@dataclass(frozen=True)
class Unplaced:
    """A reply to a message that is about no question the bridge knows (the
    shell decides whether it was meant for the bridge: whom it mentions)."""

    event_id: str
    room_id: str
    sender: str
    ts: int
    mentions: tuple[str, ...] = ()
    # (question title, whose answer): it replies to another person's answer.
    about: tuple[str, str] | None = None


Found = Candidate | Withdrawal | VoteWithdrawal | Unreadable | Annotation | Unplaced | PollEnd


def normalize(event: dict[str, Any], lookup: Lookup) -> Found | None:
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
    if not isinstance(content, dict) or not isinstance(kind, str):
        return None  # a forged event's type may be anything, even unhashable
    if kind in (ANSWER_TYPE, "m.room.message") and _is_notice(content):
        return None
    if kind in POLL_RESPONSE_TYPES:
        return _poll_vote(event, content, lookup)
    if kind in POLL_END_TYPES:
        poll = _related(content, "m.reference")
        question = lookup.question_by_poll(poll) if poll else None
        if question is None:
            return None
        return PollEnd(question, _s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"),
                       timestamp(event.get("origin_server_ts")))
    if kind == "m.reaction":
        return _reaction(event, content, lookup)
    if kind == ANSWER_TYPE or (kind == "m.room.message" and content.get("suite_event_type") == ANSWER_TYPE):
        return _answer_event(event, content, lookup, via="answer_event")
    if kind != "m.room.message":
        return None
    if _is_edit(content):
        new = content.get("m.new_content")
        if isinstance(new, dict) and new.get("suite_event_type") == ANSWER_TYPE:
            return _edit(event, content, new, lookup)
        if isinstance(new, dict):
            return _edited_gesture(event, content, new, lookup)
        return None
    return _message(event, content, lookup)


# ---------------------------------------------------------------- answer events


def _answer_event(event: dict[str, Any], content: dict[str, Any], lookup: Lookup, *, via: str) -> Candidate:
    return Candidate(_incoming(event, content, via), _question_for(content, lookup))


def _edit(event: dict[str, Any], content: dict[str, Any], new: dict[str, Any], lookup: Lookup) -> Candidate:
    # An edit inherits the reference of the answer it replaces; the judge then
    # checks it as usual.  One m.new_content carries is ignored, as the spec
    # says: taken, an edit of an answer to one question moved it to another.
    original = content["m.relates_to"].get("event_id")
    reference = None
    if isinstance(original, str):
        # An answer refused (before the escalation, an option not offered) and
        # put right by its edit: the edit is a new answer to the same question.
        logged = lookup.logged_question(original)
        reference = lookup.answer_reference(original) or (logged[0] if logged else None)
    merged = {key: value for key, value in new.items() if key != "m.relates_to"}
    if reference:
        merged["m.relates_to"] = {"rel_type": "m.reference", "event_id": reference}
    return Candidate(_incoming(event, merged, "edit"), _question_for(merged, lookup), replaces=original)


def posting_keys(events: Iterable[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """What a batch's events may look their postings up by (``_question_for``,
    polls, replies): elicitation ids, and the events they relate to (a
    posting, a poll, a message replied to), so a store can read them at once."""
    elicitations: set[str] = set()
    targets: set[str] = set()
    for event in events:
        content = event.get("content")
        if not isinstance(content, dict):
            continue
        for part in (content, content.get("m.new_content")):
            if isinstance(part, dict) and isinstance(part.get("elicitation_id"), str):
                elicitations.add(part["elicitation_id"])
        relates = content.get("m.relates_to")
        if isinstance(relates, dict):
            reply = relates.get("m.in_reply_to")
            for target in (relates.get("event_id"), reply.get("event_id") if isinstance(reply, dict) else None):
                if isinstance(target, str):
                    targets.add(target)
    return elicitations, targets


def poll_votes(events: Iterable[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """The (poll, sender) of a batch's poll votes, each with its earliest
    ``origin_server_ts``: a vote asks whether an empty vote later in the room
    took it back (``Timeline.vote_cleared``), and a store can read that for
    all of them with the batch's other look-ups."""
    votes: dict[tuple[str, str], int] = {}
    for event in events:
        content = event.get("content")
        poll = _related(content, "m.reference") if isinstance(content, dict) else None
        if _s(event, "type") in POLL_RESPONSE_TYPES and poll is not None and isinstance(event.get("sender"), str):
            key, ts = (poll, event["sender"]), timestamp(event.get("origin_server_ts"))
            votes[key] = min(ts, votes.get(key, ts))
    return votes


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


# ---------------------------------------------------------------- polls and reactions


def is_empty_vote(event: dict[str, Any]) -> bool:
    """A poll response naming no option: it takes its sender's earlier votes
    back, and a redaction of it does not give them back (see Timeline)."""
    content = event.get("content")
    return _s(event, "type") in POLL_RESPONSE_TYPES and isinstance(content, dict) and _selections(content) == []


def _poll_vote(event: dict[str, Any], content: dict[str, Any], lookup: Lookup) -> Found | None:
    poll = _related(content, "m.reference")
    question = lookup.question_by_poll(poll) if poll else None
    if question is None:
        return None
    selections = _selections(content)
    if selections is None:
        return None
    if not selections:
        return VoteWithdrawal(question, _s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"))
    # The poll allows one answer; a client sending more is read as MSC3381
    # says: only the first max_selections (1) count.
    first = selections[0]
    if not isinstance(first, str) or not first:
        return Unreadable(_incoming(event, content, "poll"), question, "This vote names no option of the poll.")
    return Candidate(_incoming(event, _answer_content(question, Pick(option_id=first), first), "poll"), question)


def _selections(content: dict[str, Any]) -> list[Any] | None:
    # Element sends the MSC3381 shape even on a stable-type poll; the stable
    # shape (`m.selections`) is taken too, and its MSC draft nesting.
    for key in ("org.matrix.msc3381.poll.response", "m.poll.response"):
        value = content.get(key)
        if isinstance(value, dict) and isinstance(value.get("answers"), list):
            return value["answers"]
    if isinstance(content.get("m.selections"), list):
        return content["m.selections"]
    return None


def _reaction(event: dict[str, Any], content: dict[str, Any], lookup: Lookup) -> Found | None:
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict) or relates.get("rel_type") != "m.annotation":
        return None
    target, key = relates.get("event_id"), relates.get("key")
    if not isinstance(target, str) or not isinstance(key, str) or keycap_number(key) is None:
        return None  # 👍 and friends are not answers
    question = lookup.question_by_event(target) or lookup.question_by_poll(target)
    if question is None:
        return None
    incoming = _incoming(event, content, "reaction")
    pick = keycap_pick(key, question)
    if pick is None or (question.kind not in SINGLE_PICK_KINDS and pick.option_id not in BUILTIN_IDS):
        number = keycap_number(key) or 0
        shown = str(number) if number > len(question.options) else key  # "there is no option 10"
        return Unreadable(incoming, question, _cant_read(shown, question), reason="unreadable_reaction")
    return Candidate(_incoming(event, _answer_content(question, pick, key), "reaction"), question)


# ---------------------------------------------------------------- replies, threads, edits


def _message(event: dict[str, Any], content: dict[str, Any], lookup: Lookup) -> Found | None:
    question, in_thread = _addressed_question(content, lookup, _s(event, "sender"))
    if question is None:
        return _unplaced(event, content, lookup)
    msgtype = _s(content, "msgtype")
    if msgtype in FILE_MSGTYPES:
        target = _direct_target(content)
        if target != question.event_id and lookup.question_by_poll(target or "") is None:
            # Files are fetched only when sent to the question (or its poll)
            # itself; one sent to the bridge's word about it is told so, not dropped in silence.
            return _misplaced_file(event, content, question)
        return _attachment(event, content, question, lookup)
    body = content.get("body")
    if msgtype not in TEXT_MSGTYPES or not isinstance(body, str):
        return None
    return _read_words(event, body, question, lookup, in_thread=in_thread, via="reply")


def _edited_gesture(event: dict[str, Any], content: dict[str, Any], new: dict[str, Any], lookup: Lookup) -> Found | None:
    """An edit of a reply or a note: the new words are read as the original was."""
    original = content["m.relates_to"]["event_id"]
    logged = lookup.logged_question(original)
    question = lookup.question_by_event(logged[0]) if logged else None
    body = new.get("body")
    if question is None or not isinstance(body, str):
        return None
    msgtype = _s(new, "msgtype") or "m.text"
    if msgtype in FILE_MSGTYPES and logged is not None and logged[1] == "attachment":
        if lookup.attachment(_s(event, "event_id")) is not None:
            # The edit sent another file (fetched under its own id): that
            # file, and its caption, stand in for the first, kept or not.
            sent = _attachment(event, new, question, lookup)
            return replace(sent, via="edit", replaces=original)
        # A file's caption edited (Element sends the file message again, new
        # body, same file): the note changes, the file stays the one kept.
        kept = _attachment({**event, "event_id": original}, new, question, lookup)
        if not kept.attachments:
            return None  # the file was not kept: there is no note of it to change
        return replace(kept, event_id=_s(event, "event_id"), ts=_ts(event), via="edit", replaces=original)
    if msgtype not in TEXT_MSGTYPES:
        return None
    in_thread = logged is not None and logged[1] in ("note", "thread")
    return _read_words(event, body, question, lookup, in_thread=in_thread, via="edit", replaces=original)


def _read_words(event: dict[str, Any], body: str, question: RecordedQuestion, lookup: Lookup, *, in_thread: bool,
                via: str, replaces: str | None = None) -> Found:
    pick = read_reply(body, question)
    # In the thread, words on a text question the person already answered
    # are a remark about their answer, not a second one (someone else's
    # first words there are their answer).
    if pick is not None and in_thread and question.kind == "text" and pick.option_id is None \
            and lookup.has_answered(question, _s(event, "sender")):
        pick = None
    if pick is not None:
        answer = _incoming(event, _answer_content(question, pick, body), via)
        return Candidate(answer, question, replaces=replaces)
    if in_thread:
        note = parse_note(body)
        return Annotation(_s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"), _ts(event), question,
                          via="note" if via == "reply" else via, note=note.text or None,
                          timecodes=tuple(tc.as_record() for tc in note.timecodes), replaces=replaces)
    return Unreadable(_incoming(event, {"body": body}, via), question, _cant_read(body, question), replaces=replaces)


def _attachment(event: dict[str, Any], content: dict[str, Any], question: RecordedQuestion, lookup: Lookup) -> Annotation:
    saved = lookup.attachment(_s(event, "event_id"))
    path, problem = saved if saved is not None else (None, "attachment_not_fetched")
    # A body that differs from the file name is the caption the person typed.
    body, filename = content.get("body"), content.get("filename")
    caption = body if isinstance(body, str) and isinstance(filename, str) and body != filename else None
    note = parse_note(caption) if caption else None
    return Annotation(_s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"), _ts(event), question,
                      via="attachment", note=(note.text or None) if note else None,
                      attachments=(path,) if path else (),
                      timecodes=tuple(tc.as_record() for tc in note.timecodes) if note else (),
                      problem=None if path else (problem or "attachment_not_saved"),
                      filename=filename if isinstance(filename, str) else body if isinstance(body, str) else None)


def _misplaced_file(event: dict[str, Any], content: dict[str, Any], question: RecordedQuestion) -> Annotation:
    body, filename = content.get("body"), content.get("filename")
    return Annotation(_s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"), _ts(event), question,
                      via="attachment", problem="attachment_misplaced",
                      filename=filename if isinstance(filename, str) else body if isinstance(body, str) else None)


def _addressed_question(content: dict[str, Any], lookup: Lookup,
                        sender: str = "") -> tuple[RecordedQuestion | None, bool]:
    """The question a message is about, and whether it was sent in that question's thread.

    A reply counts for the question when it replies to the question, to its
    poll, to any message the bridge sent about it (an acknowledgement, a
    refusal, a reminder, a close notice) or to the sender's own earlier
    answer: people reply to what is in front of them.
    """
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None, False
    if relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        root = lookup.question_by_event(relates["event_id"])
        if root is not None:
            return root, True
        # A thread started on the bridge's word about a question (or on one's
        # own answer) reads as a reply to it; only the question's thread holds notes.
        return _replied_question(relates["event_id"], lookup, sender), False
    reply = relates.get("m.in_reply_to")
    target = reply.get("event_id") if isinstance(reply, dict) else None
    if not isinstance(target, str):
        return None, False
    return _replied_question(target, lookup, sender), False


def _replied_question(target: str, lookup: Lookup, sender: str) -> RecordedQuestion | None:
    found = lookup.question_by_event(target) or lookup.question_by_poll(target)
    if found is None:
        about = lookup.reply_target(target)
        if about is not None and about[1] in (None, sender):
            found = lookup.question_by_event(about[0])
    return found


def _direct_target(content: dict[str, Any]) -> str | None:
    """The thread root, or else the event replied to."""
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None
    if relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        return relates["event_id"]
    reply = relates.get("m.in_reply_to")
    target = reply.get("event_id") if isinstance(reply, dict) else None
    return target if isinstance(target, str) else None


def _unplaced(event: dict[str, Any], content: dict[str, Any], lookup: Lookup) -> Unplaced | None:
    relates = content.get("m.relates_to")
    reply = relates.get("m.in_reply_to") if isinstance(relates, dict) else None
    # Only what a person types: a notice is a bot's, and bots must not set each other off.
    if not isinstance(reply, dict) or not isinstance(reply.get("event_id"), str) \
            or _s(content, "msgtype") not in TEXT_MSGTYPES:
        return None
    mentions = content.get("m.mentions")
    users = mentions.get("user_ids") if isinstance(mentions, dict) else None
    named = tuple(u for u in users if isinstance(u, str)) if isinstance(users, list) else ()
    about = None
    target = lookup.reply_target(reply["event_id"])
    question = lookup.question_by_event(target[0]) if target is not None else None
    if target is not None and target[1] is not None and question is not None:
        about = (str(question.question.get("title", question.qid)), target[1])
    return Unplaced(_s(event, "event_id"), _s(event, "room_id"), _s(event, "sender"), _ts(event), named, about)


# ---------------------------------------------------------------- building


def _answer_content(question: RecordedQuestion, pick: Pick, body: str) -> dict[str, Any]:
    """The ``question.answer.v2`` content a gesture at ``question`` stands for.

    The reference and elicitation are the question's own: the person answered
    the message they saw.  For the same reason a subject-bound question's
    binding is the one that message showed.
    """
    content: dict[str, Any] = {
        "msgtype": "m.text",
        "body": body,
        "schema_version": 1,
        "suite_event_type": ANSWER_TYPE,
        "elicitation_id": question.elicitation_id or "",
        "m.relates_to": {"rel_type": "m.reference", "event_id": question.event_id},
    }
    if question.subject_bound and isinstance(question.content.get("subject"), dict):
        content["subject"] = dict(question.content["subject"])
    content.update(pick.fields())
    return content


def _cant_read(what: str, question: RecordedQuestion) -> str:
    shown = " ".join(visible(what).split())  # (a U+202E in it turned the bridge's words after it around)
    shown = shorten(shown, 60)
    title = shown_title(question.question.get("title") or question.qid or "this question")
    missing = numbers_out_of_range(what, question)
    if missing:
        named = " or ".join(str(n) for n in missing)
        return (f"There is no option {named} in \u201c{title}\u201d; the options are 1\u2013{valid_numbers(question)}. "
                f"{help_text(question)}")
    return f"I couldn't read \u201c{shown}\u201d as an answer to \u201c{title}\u201d. {help_text(question)}"


def _incoming(event: dict[str, Any], content: Any, via: str) -> IncomingAnswer:
    return IncomingAnswer(
        event_id=_s(event, "event_id"),
        room_id=_s(event, "room_id"),
        sender=_s(event, "sender"),
        origin_server_ts=_ts(event),
        content=content,
        via=via,
    )


def _related(content: dict[str, Any], rel_type: str) -> str | None:
    relates = content.get("m.relates_to")
    if isinstance(relates, dict) and relates.get("rel_type") == rel_type and isinstance(relates.get("event_id"), str):
        return relates["event_id"]
    return None


def _is_notice(content: dict[str, Any]) -> bool:
    """A message sent as ``m.notice``, or edited into one.  The Matrix spec
    says a notice must never be answered automatically (two bots answering
    each other's notices loop), and the protocol (PROTOCOL.md) reads answers
    from what people type: a notice is no answer and no note here, and
    gets no word back, whatever it says, a structured answer too
    (the judge refused that one anyway, with a notice back to a notice)."""
    new = content.get("m.new_content")
    return content.get("msgtype") == "m.notice" or (isinstance(new, dict) and new.get("msgtype") == "m.notice")


def _is_edit(content: dict[str, Any]) -> bool:
    return _related(content, "m.replace") is not None


def _ts(event: dict[str, Any]) -> int:
    ts = event.get("origin_server_ts")
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else 0


def _s(event: dict[str, Any], key: str) -> str:
    value = event.get(key)
    return value if isinstance(value, str) else ""
