"""The room's rules for what an event changes, applied against the store.

Events reach the bridge in any order and by several paths (sync, back-fill,
appservice transactions, the safety net, decryption later); clients show the
room's timeline.  This keeps the two in step for what order alone cannot
settle: an edit counts only from the sender of what it edits and waits for
its original when that comes later; a redaction counts from the target's
sender or someone with the power to redact others, and waits for a target
not seen yet (held for decryption, or coming by a slower path), which is
then dropped unjudged, unless it is an empty poll vote (that takes its
sender's earlier votes back whichever of the two the bridge reads first),
or a vote on a quorum the bridge held for its keys, or an edit that waited
for its original: those are judged, then withdrawn at the redaction's place.
Everything here runs inside the pipeline's batch transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from bridge.protocol.authorship import may_redact
from bridge.protocol.normalize import PollEnd, Withdrawal
from bridge.service.answering.membership import is_power_levels
from bridge.service.storage.redactions import poll_end_key
from bridge.service.storage.store import Store, votes_key

log = logging.getLogger(__name__)

# What a redaction did: it withdrew (set_dir, set_id, qid), or withdrew
# nothing the record held (None), or it does not count / waits (NOT_NOW).
NOT_NOW = object()


class Timeline:
    def __init__(self, store: Store, power: dict[str, dict[str, Any]]):
        self.store = store
        self.power = power  # room -> m.room.power_levels content, kept current by the pipeline
        # Question event id -> [(ts, by, event id)] of its poll's ends that count, kept
        # current by ``poll_end`` (read once: a vote then costs no round trip).
        self.poll_ends: dict[str, list[tuple[int, str, str]]] = store.poll_ends()

    def redacted(self, event_id: str, sender: str, room_id: str) -> bool:
        """Whether a redaction that counts has been seen for this event."""
        levels = self.power.get(room_id)
        return any(may_redact(by, sender, levels) for by in self.store.redactions_of(event_id))

    def drop_redacted(self, event_id: str) -> None:
        """A redaction of this event was read before the event could be: it is dropped unjudged."""
        self.store.mark_processed(event_id, "withdrawn")
        log.info("event %s was redacted before it could be read; dropped", event_id)

    def edit_of_author(self, event: dict[str, Any], event_id: str, sender: str,
                       target: str) -> dict[str, Any] | None:
        """The edit as the spec counts it, or None: an edit from anyone but the
        original's sender is ignored (clients ignore it too), and so is an
        edit of a redacted event, and an edit of an edit (the spec's rule:
        clients show the original with its own edits, never the edit's
        edits); an edit whose original has not arrived waits for it (parked,
        judged when it comes, or ignored then if what it edits is an edit)."""
        original = self.store.original_of(target)
        self.store.link_edit(event_id, original)
        if original != target:
            log.info("edit %s of the edit %s ignored: only edits of the original count", event_id, target)
            self.store.mark_processed(event_id, "ignored")
            return None
        author = self.store.logged_sender(original)
        if author is None:
            self.store.park_edit(event, original, self.store.clock.now_ms())
            self.store.mark_processed(event_id, "parked")
            return None
        if self.redacted(original, author, str(event.get("room_id"))):
            self.store.mark_processed(event_id, "withdrawn")
            return None
        if author != sender:
            log.info("edit %s by %s of %s's event %s ignored: only its sender may edit it",
                     event_id, sender, author, original)
            self.store.mark_processed(event_id, "ignored")
            return None
        return event

    def redaction(self, found: Withdrawal, ts: int, held: bool = False) -> Any:
        """Apply a redaction: the question it touched, None, or NOT_NOW.
        ``held``: one kept while its target was held, applied now the target is judged."""
        target = found.target
        ended = next(((question, end) for question, ends in self.poll_ends.items() for end in ends
                      if end[2] == target), None)
        if ended is not None:
            # A poll's end redacted: clients show the poll open again.
            question, (_at, by, _event) = ended
            if may_redact(found.sender, by, self.power.get(found.room_id)):
                self.poll_ends[question] = [end for end in self.poll_ends[question] if end[2] != target]
                self.store.forget_redaction(target, poll_end_key(question))
                log.info("the end %s of the poll of %s was redacted: it takes votes again", target, question)
            self.store.mark_processed(found.event_id, "withdrawn")
            return NOT_NOW
        author = self.store.sender_of(target)
        # Kept either way: a target yet to come is dropped when it does, and
        # an edit of a redacted event is ignored.
        self.store.keep_redaction(found.event_id, target, found.room_id, found.sender, ts)
        if author is None:
            # Whether it counts (its sender's power over the author's) is
            # told when the target comes: "kept" until it is applied then
            # (``Pipeline._redactions_kept``), when it takes its outcome.
            self.store.mark_processed(found.event_id, "kept")
            return NOT_NOW
        if not may_redact(found.sender, author, self.power.get(found.room_id)):
            log.info("redaction %s by %s of %s's event %s ignored: not theirs, and no power to redact others",
                     found.event_id, found.sender, author, target)
            self.store.mark_processed(found.event_id, "ignored")
            return NOT_NOW
        if not held and (self.store.is_undecrypted(target) or self.store.is_parked(target)):
            # Held for its keys, or an edit waiting for its original: judged
            # when they come, then withdrawn at this redaction's place in the
            # room (the pipeline's ``_redactions_kept``).  Dropped, the time
            # it stood was lost: a veto it made had decided.
            self.store.mark_processed(found.event_id, "withdrawn")
            return NOT_NOW
        self.store.mark_processed(target, "withdrawn")
        return self.store.withdraw(target)

    def clear_votes(self, question_event_id: str, sender: str, event_id: str, room_id: str,
                    ts: int) -> tuple[str, str, str] | None:
        """An empty vote: the sender's votes before it (in the room) are
        withdrawn, now and when a late one arrives."""
        self.store.keep_redaction(event_id, votes_key(question_event_id, sender), room_id, sender, ts)
        return self.store.withdraw_votes(question_event_id, sender, ts)

    def vote_cleared(self, question_event_id: str, sender: str, ts: int) -> tuple[str, int] | None:
        """The empty vote (event id, ts) later in the room that has taken back a vote sent at ``ts``, if any."""
        return self.store.redaction_since(votes_key(question_event_id, sender), ts)

    def poll_end(self, found: PollEnd, poll_sender: str) -> None:
        """Someone ended a question's poll: it counts from its sender (the
        bridge, whose poll it is) or someone with the power to redact it, as
        clients count it (Element shows the votes until then as final, and
        takes no more); votes placed after it are refused from then on."""
        if not may_redact(found.sender, poll_sender, self.power.get(found.room_id)):
            log.info("poll end %s by %s ignored: not the poll's sender, and no power to end it",
                     found.event_id, found.sender)
            self.store.mark_processed(found.event_id, "ignored")
            return
        self.store.keep_redaction(found.event_id, poll_end_key(found.question.event_id), found.room_id,
                                  found.sender, found.ts)
        self.store.mark_processed(found.event_id, "withdrawn")
        ends = self.poll_ends.get(found.question.event_id, [])
        self.poll_ends[found.question.event_id] = sorted([*ends, (found.ts, found.sender, found.event_id)])
        log.info("the poll of %s was ended by %s: votes after it are refused", found.question.event_id, found.sender)

    def poll_ended(self, question_event_id: str, ts: int) -> tuple[str, int] | None:
        """(by whom, when) the question's poll was ended at or before ``ts``, if it was."""
        first = next(iter(self.poll_ends.get(question_event_id, ())), None)
        return (first[1], first[0]) if first is not None and first[0] <= ts else None

    def snapshot(self) -> dict[str, list[tuple[int, str, str]]]:
        return {question: list(ends) for question, ends in self.poll_ends.items()}

    def track_power(self, event: dict[str, Any]) -> None:
        if is_power_levels(event) and isinstance(event.get("content"), dict):
            self.power[str(event.get("room_id"))] = event["content"]

