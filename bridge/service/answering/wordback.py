"""The word back: what the bridge tells a person about what they sent
(recorded, added, refused, withdrawn), and on a quorum where the votes stand.

The content of one notice for one logged entry, from what the store holds
of it and its question; ``Notices`` sends it (and retries what is not sent
yet).  Split from the pipeline, which judges and writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bridge.protocol.outcome import OWN, OTHER, addressed, annotated_notice, describe_record, display_names, \
    in_thread, in_thread_reply, option_numbers, recorded_notice, refused_notice, with_remark
from bridge.protocol.quorum import EXPIRED, Tally, progress_words
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.withdrawn import withdrawn_notice
from bridge.service.answering import quiz
from bridge.service.storage.store import LogEntry, Store


@dataclass
class WordBack:
    store: Store

    def _stood_before(self, entry: LogEntry) -> str | None:
        """Whose answer the record held just before ``entry`` in the room's order, if any still stands."""
        if entry.set_dir is None or entry.qid is None:
            return None
        sender = self.store.standing_before(entry.set_dir, entry.qid, entry.event_id)
        return None if sender is None else OWN if sender == entry.sender else OTHER

    def _pick_sender(self, entry: LogEntry) -> str | None:
        """Who gave the answer that stands for ``entry``'s question (a note adds to it); None: none stands."""
        if entry.set_dir is None or entry.qid is None:
            return None
        return self.store.standing_pick_sender(entry.set_dir, entry.qid)

    def notice_for(self, entry: LogEntry, replaced: int = 0) -> dict[str, Any]:
        """The word back on ``entry``; ``replaced``: how many earlier answers
        of the same person to the same question it also stands for."""
        question = self.store.question_by_event(entry.question_event_id) if entry.question_event_id else None
        via = entry.via if entry.via in _OUTCOME_VIAS else None
        if entry.outcome == "withdrawn":
            return self._withdrawal_notice(entry, question)
        if entry.outcome == "accepted" and entry.record is not None and question is not None:
            content = recorded_notice(answer_event_id=entry.event_id, question_event_id=question.event_id,
                                      record=entry.record, title=question.content["question"]["title"], via=via,
                                      extra=quiz.feedback_for(entry, question), labels=display_names(question),
                                      subject=question.subject if question.subject_bound else None,
                                      replaced=replaced, numbers=option_numbers(question),
                                      edited_counted=entry.replaces is not None and
                                      self.store.edited_counted(entry.replaces, entry.event_id),
                                      # On a quorum each person's vote stands beside the others'; none replaces another's.
                                      stood_before=None if question.quorum is not None else self._stood_before(entry))
            if entry.message:  # written to no answers.json: its set was removed as it came
                content = with_remark(content, entry.message)
        elif entry.outcome == "annotated" and entry.record is not None and question is not None:
            picker = self._pick_sender(entry)
            content = annotated_notice(answer_event_id=entry.event_id, question_event_id=question.event_id,
                                       added=entry.record, title=question.content["question"]["title"],
                                       qid=question.qid or "", q_rev=question.rev or 1,
                                       record_rev=self._record_rev(entry), picked=picker is not None,
                                       whose=None if picker in (None, entry.sender) else picker,
                                       edited=entry.replaces is not None and
                                       self.store.edited_counted(entry.replaces, entry.event_id, "annotated"))
            if entry.message:  # the file that came with the note could not be kept
                content = with_remark(content, entry.message)
            if replaced > 0:  # one reply for a run of them (a flood gets a handful of replies)
                content = with_remark(content, f"({replaced} earlier addition{'s' if replaced > 1 else ''} of "
                                               f"yours to this answer {'were' if replaced > 1 else 'was'} kept too.)")
        else:
            message = entry.message or "the answer could not be read."
            if entry.reason == "input_required":
                message = _where_the_words_go(message, entry.via)
            content = refused_notice(answer_event_id=entry.event_id, question_event_id=entry.question_event_id,
                                     qid=entry.qid, layer=entry.layer or "recorded", reason=entry.reason or "refused",
                                     message=message, via=via)
            if entry.replaces and question is not None and (kept := self._edited_still_stands(entry, question)):
                content = with_remark(content, kept)
        if question is not None and question.quorum is not None and entry.outcome == "accepted":
            content = with_remark(content, *self._quorum_words(entry, question))
        elif question is not None and entry.outcome == "accepted" and entry.record is not None:
            later, named = self._later_stands(entry, question)
            if later:
                content = with_remark(content, later, named)
        if entry.replaces:
            # An edit: clients show the original message, not the edit event.
            content["m.relates_to"] = {"m.in_reply_to": {"event_id": entry.replaces}}
        if question is not None and (entry.via in _THREAD_VIAS or (entry.outcome == "annotated" and entry.replaces)):
            # A note or a file sent in the question's thread (or a note's
            # edit, which clients show as the note): the word back replies
            # to it there, so it shows whose it is.
            content["m.relates_to"] = in_thread_reply(question.event_id, entry.replaces or entry.event_id)
        elif question is not None and entry.via not in _TIMELINE_VIAS:
            # A vote or a reaction has no message to quote: the word back goes
            # to the question's thread, saying whom it is for.
            content = addressed(content, entry.sender)
            content["m.relates_to"] = in_thread(question.event_id)
        elif entry.thread_root is not None:
            # An answer sent in a thread: a plain reply to it shows nowhere in
            # Element, so the word back joins the thread, replying to it there.
            replied = content.get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id", entry.event_id)
            content["m.relates_to"] = in_thread_reply(entry.thread_root, replied)
        return content

    def _edited_still_stands(self, entry: LogEntry, question: RecordedQuestion) -> str | None:
        """An edit refused (its words no answer) while the answer it edits
        stands: the message now reads otherwise in the room, so say what counts."""
        now = self.store.projection(entry.set_dir, entry.qid) if entry.set_dir and entry.qid else None
        source = (now or {}).get("source") or {}
        # (The answer that stands is theirs: the original, or an edit of it accepted before.)
        if now is None or now.get("state") not in ("answered", "unsure") or source.get("sender") != entry.sender:
            return None
        return f"Your answer, {describe_record(now, display_names(question))}, still stands."

    def _later_stands(self, entry: LogEntry, question: RecordedQuestion) -> tuple[str, list[str]]:
        """An answer read after a later one in the room (a server catching
        up): recorded, and not the one that stands; said, with the one that does."""
        now = self.store.projection(entry.set_dir, entry.qid) if entry.set_dir and entry.qid else None
        source = (now or {}).get("source") or {}
        if now is None or now.get("state") != "answered" or source.get("event_id") in (entry.event_id, entry.replaces) \
                or not isinstance(source.get("ts"), int) or source["ts"] <= entry.ts:
            return "", []
        sender = str(source.get("sender"))
        whose = "your later answer" if sender == entry.sender else f"the answer {sender} gave after it"
        return (f"It does not stand: {whose} in the room does, {describe_record(now, display_names(question))}.",
                [] if sender == entry.sender else [sender])

    def _quorum_words(self, entry: LogEntry, question: RecordedQuestion) -> tuple[str, list[str]]:
        """Where the votes stand: "1 of 2 for “Ship it” so far; waiting for @bo or @cy",
        and the people it names."""
        record = self.store.projection(entry.set_dir, entry.qid) if entry.set_dir and entry.qid else None
        record = record or {}
        required, veto = question.quorum or (1, frozenset())
        labels = display_names(question)
        tally = Tally(record.get("state"), record.get("votes") or [], record.get("choice"),
                      record.get("decided_by") or [], veto=record.get("choice") in veto)
        people = question.answerers_at(entry.ts)
        named = people + [v.get("sender", "") for v in tally.votes] + tally.decided_by
        if record.get("decided_by") and _deciding(record, entry.sender):
            before = _votes_until(record, entry.event_id)
            if before is not None and entry.sender != record["decided_by"][-1]:
                # One of the votes that decided it, not the last: read in one
                # batch with the deciding one, it hears what it would have
                # heard read alone, where the votes stood at it.
                return progress_words(Tally(None, before), required, people, labels), named
            # The decision's own announcement follows in the thread and says
            # who decided; this word back only says this vote was the one.
            return ("With your veto it is decided." if tally.veto else "With your vote it is decided."), named
        words = progress_words(tally, required, people, labels)
        if record.get("decided_by") and not _deciding(record, entry.sender):
            # After the decision (a vote, a changed vote, a withdrawn one): it stands.
            words += " Withdrawing it does not change the decision." if entry.outcome == "withdrawn" \
                else " Your vote is recorded; it does not change the decision."
        elif record.get("state") == EXPIRED and entry.outcome == "withdrawn" and \
                any(v.get("sender") == entry.sender for v in tally.votes):
            # Taken back after the deadline: the expiry keeps what stood then.
            words += " Your vote stood at the deadline; withdrawing it now does not change that."
        return words, named

    def _withdrawal_notice(self, entry: LogEntry, question: RecordedQuestion | None) -> dict[str, Any]:
        """Told where the acknowledgement of what was withdrawn went, as a reply to it."""
        logged = self.store.logged_question(entry.replaces) if entry.replaces else None
        withdrawn_via = logged[1] if logged else entry.via
        ack = self.store.acknowledgement_of(entry.replaces) if entry.replaces else None
        now = self.store.projection(entry.set_dir, entry.qid) if entry.set_dir and entry.qid else None
        title = question.question.get("title", entry.qid) if question else (entry.qid or "")
        quorum = question is not None and question.quorum is not None
        own_vote = self._own_vote(entry, question, now) if quorum else None
        content = withdrawn_notice(event_id=entry.event_id, withdrawn_event_id=entry.replaces,
                                   question_event_id=entry.question_event_id, qid=entry.qid, title=str(title),
                                   withdrawn_via=withdrawn_via, now=now, reply_to=ack or entry.event_id,
                                   labels=display_names(question) if question else None,
                                   # On a quorum the record is everyone's votes, not this person's earlier answer.
                                   vote=quorum, by=entry.sender,
                                   again=self._stands_again(entry, now, own_vote[0] if own_vote else None),
                                   stood=_stood_at_deadline(entry, question, now),
                                   own_vote=own_vote[1:] if own_vote else None)
        if question is not None and quorum:
            content = with_remark(content, *self._quorum_words(entry, question))
        if question is not None and (ack is None or withdrawn_via not in _TIMELINE_VIAS):
            if ack is not None:
                content["m.relates_to"] = in_thread_reply(question.event_id, ack)
            else:  # nothing to quote: say whom it is for
                content = addressed(content, entry.sender)
                content["m.relates_to"] = in_thread(question.event_id)
        elif entry.thread_root is not None:
            # What was withdrawn was sent in a thread: the word back stays there.
            content["m.relates_to"] = in_thread_reply(entry.thread_root, ack or entry.event_id)
        return content

    def _stands_again(self, entry: LogEntry, now: dict[str, Any] | None, standing_id: str | None = None) -> bool:
        """Whether the answer standing after a withdrawal (``standing_id``: on
        a quorum, the person's vote that counts now) comes before the
        withdrawn one in the room's order (it stands again), rather than after
        it (the withdrawn one had not been standing: nothing changed)."""
        if entry.replaces:
            withdrawn = self.store.accepted_answer(entry.replaces)
        elif entry.via == "poll" and entry.question_event_id:
            # An empty vote names nothing it replaces: it took back the person's vote in the poll before it.
            withdrawn = self.store.poll_vote_before(entry.question_event_id, entry.sender, entry.ts)
        else:
            withdrawn = None
        if standing_id is not None:
            standing = self.store.accepted_answer(standing_id)
            standing_ts = standing.ts if standing is not None else None
        else:
            standing_ts = ((now or {}).get("source") or {}).get("ts")
        return withdrawn is None or not isinstance(standing_ts, int) or standing_ts <= withdrawn.ts

    def _own_vote(self, entry: LogEntry, question: RecordedQuestion, now: dict[str, Any] | None
                  ) -> tuple[str, str | None, str] | None:
        """(event id, how it was given, its pick's label) of another vote of the
        same person that counts after the withdrawal, if one does: they are
        told it counts, not left thinking they withdrew their consent."""
        mine = next((v for v in (now or {}).get("votes") or [] if v.get("sender") == entry.sender), None)
        if mine is None or mine.get("event_id") in (entry.replaces, entry.event_id):
            return None
        logged = self.store.logged_question(str(mine.get("event_id")))
        if entry.replaces is None and entry.via == "poll" and logged is not None and logged[1] == "poll":
            # An empty vote takes back the poll vote; one still counted is that
            # very vote, standing at the deadline (said apart), not another.
            return None
        choice = str(mine.get("choice"))
        return str(mine.get("event_id")), logged[1] if logged else None, display_names(question).get(choice, choice)

    def _record_rev(self, entry: LogEntry) -> int:
        record = self.store.projection(entry.set_dir, entry.qid) if entry.set_dir and entry.qid else None
        return record["rev"] if record else 1


def _stood_at_deadline(entry: LogEntry, question: RecordedQuestion | None, now: dict[str, Any] | None) -> bool:
    """A withdrawal after the deadline of a question without a quorum, of the
    answer that stood when the deadline closed it (and so stands still)."""
    return question is not None and question.quorum is None and question.expires_ms is not None and \
        entry.ts >= question.expires_ms and now is not None and now.get("state") == "answered" and \
        (now.get("source") or {}).get("event_id") == entry.replaces


def _votes_until(record: dict[str, Any], event_id: str) -> list[dict[str, Any]] | None:
    """The record's votes up to and with the one ``event_id`` cast (in the
    room's order); None when it cast none of them."""
    votes = record.get("votes") or []
    for n, vote in enumerate(votes):
        if vote.get("event_id") == event_id:
            return votes[:n + 1]
    return None


def _deciding(record: dict[str, Any], sender: str) -> bool:
    """Whether ``sender``'s standing vote is one that decided the quorum (no
    remark then: it is the decision); a decider who changed or withdrew it is told it stands."""
    return sender in record.get("decided_by", []) and any(
        v.get("sender") == sender and v.get("choice") == record.get("choice") for v in record.get("votes") or [])


# Answers that are a click, with no room for text.
_GESTURE_VIAS = frozenset({"poll", "reaction"})
# The judge's words for an answer that needs words: what an answer event does
# (its ``text``), which no one in Element can do.
_ADD_AS_TEXT = " Add them as text."


def _where_the_words_go(message: str, via: str | None) -> str:
    """An answer refused for want of words, told where a person puts them.
    Only "Something else" takes words, and a reply gives them as ``other: …``."""
    if not message.endswith(_ADD_AS_TEXT):
        return message
    if via in _GESTURE_VIAS:
        # A poll or an emoji can't carry words at all: say so, and where they go.
        gesture = "a vote in the poll" if via == "poll" else "a reaction"
        return (message.removesuffix(_ADD_AS_TEXT).rstrip(".")
                + f", and {gesture} carries none. Reply to the question with other: and your words.")
    if via in ("reply", "edit"):
        # A reply "other" or its number: the form that carries the words.
        return (message.removesuffix(_ADD_AS_TEXT)
                + " Reply with other: and your words (for example \u201cother: only the unit tests\u201d).")
    return message


# Answers whose word back replies to them in the timeline; the rest go to the question's thread.
_TIMELINE_VIAS = frozenset({"answer_event", "reply", "edit"})
# Messages sent in the question's thread, whose word back replies to them there.
_THREAD_VIAS = frozenset({"note", "attachment"})
# The `via` values the outcome schema knows; a note or a file is reported without one.
_OUTCOME_VIAS = frozenset({"answer_event", "poll", "reply", "reaction", "edit"})
