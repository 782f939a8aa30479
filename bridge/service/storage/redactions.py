"""Redactions and edits, whichever comes first: a redaction is kept
(``redaction``) so one that came before its target still takes it back, an
edit whose target has not arrived yet waits (``parked_edit``) and is
dropped if it never comes, and every edit is linked to what it edits
(``edit_link``) so an edit of an edit finds the original."""

from __future__ import annotations

import json
from typing import Any, Iterable

# An edit whose original never comes is dropped after this long.
PARKED_FOR_MS = 7 * 24 * 3600 * 1000

_VOTES, _VOTES_BY = "votes\x1f", "\x1f"


def votes_key(question_event_id: str, sender: str) -> str:
    """The redaction target an emptied poll vote is kept under: every vote of one person in one poll."""
    return f"{_VOTES}{question_event_id}{_VOTES_BY}{sender}"


_POLL_END = "poll_end\x1f"


def poll_end_key(question_event_id: str) -> str:
    """The redaction target a poll's end is kept under: the votes of the question's poll, from then on."""
    return f"{_POLL_END}{question_event_id}"


def votes_keys(postings: dict, votes: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The ``votes_key`` of each (poll, sender) whose poll is a posting's in
    ``postings`` (a batch's memo: ``Postings.looked_up``'s keys)."""
    return {(poll, sender): votes_key(posting[0], sender) for poll, sender in votes
            if (posting := postings.get(("poll_event_id=?", poll))) is not None}


# The empty votes of each (poll, sender) pair of a VALUES list, by the
# posting the poll belongs to (``votes_key`` worked out by the database).
_EMPTY_VOTES = ("SELECT v.column1, v.column2, r.event_id, r.ts FROM (VALUES {pairs}) AS v"
                " JOIN posted p ON p.poll_event_id = v.column1"
                " JOIN redaction r ON r.target = ? || p.event_id || ? || v.column2")


class RedactionsAndEdits:
    """A part of ``Store`` (store.py): ``redaction``, ``parked_edit`` and
    ``edit_link``; what a batch read of the first two at once
    (``Store.know_batch``) answers, and these writes keep up to date."""

    def keep_redaction(self, event_id: str, target: str, room_id: str, sender: str, ts: int) -> None:
        kept = self.db.execute("INSERT INTO redaction(event_id, target, room_id, sender, ts) VALUES (?,?,?,?,?)"
                               " ON CONFLICT DO NOTHING", (event_id, target, room_id, sender, ts)).rowcount
        if self._batch is not None and kept > 0:
            self._batch.redacted_by.setdefault(target, []).append(sender)
            votes = self._batch.votes.get(target)
            if votes is not None:
                votes[1].append((ts, event_id))

    @staticmethod
    def votes_reads(votes: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
        """The read of the empty votes of each (poll, sender) pair, for ``know_votes``."""
        marks = ",".join("(?,?)" for _pair in votes)
        return [(_EMPTY_VOTES.format(pairs=marks), [*(part for pair in votes for part in pair), _VOTES, _VOTES_BY])]

    @staticmethod
    def know_votes(batch: Any, rows: list[tuple], votes: list[tuple[str, str]]) -> None:
        """What ``votes_reads`` read, into the batch's memo: every empty vote
        of each pair whose poll is a posting's (its postings known already)."""
        keys = votes_keys(batch.postings, votes)
        batch.votes.update({key: (None, []) for key in keys.values()})
        for poll, sender, event_id, ts in rows:
            if (poll, sender) in keys:
                batch.votes[keys[(poll, sender)]][1].append((ts, event_id))

    def redaction_since(self, target: str, ts: int) -> tuple[str, int] | None:
        """(event id, ts) of the first redaction of ``target`` at or after ``ts``."""
        known = self._batch.votes.get(target) if self._batch is not None else None
        if known is not None and (known[0] is None or ts >= known[0]):
            first = min((redaction for redaction in known[1] if redaction[0] >= ts), default=None)
            return (first[1], first[0]) if first else None
        row = self.db.execute("SELECT event_id, ts FROM redaction WHERE target=? AND ts>=?"
                              f" ORDER BY ts, event_id{self.sql.bytewise} LIMIT 1", (target, ts)).fetchone()
        return (row[0], row[1]) if row else None

    def poll_ends(self) -> dict[str, list[tuple[int, str, str]]]:
        """Every poll end kept (``poll_end_key``): question event id -> [(ts, sender, event id)], earliest
        first.  Few (a moderator ending a poll), and read once a start, so a vote costs no read of its own."""
        ends: dict[str, list[tuple[int, str, str]]] = {}
        for target, sender, ts, event_id in self.db.execute(
                "SELECT target, sender, ts, event_id FROM redaction WHERE target LIKE ?", (_POLL_END + "%",)).fetchall():
            if target.startswith(_POLL_END):
                ends.setdefault(target[len(_POLL_END):], []).append((ts, sender, event_id))
        return {question: sorted(found) for question, found in ends.items()}

    def forget_redaction(self, event_id: str, target: str) -> None:
        """A kept mark (a poll's end) taken back: its own event was redacted."""
        self.db.execute("DELETE FROM redaction WHERE event_id=? AND target=?", (event_id, target))

    def redactions_of(self, target: str) -> list[str]:
        """The senders of redactions that came before their target."""
        known = self._known(target)
        if known is not None:
            return list(known.redacted_by.get(target, ()))
        return [row[0] for row in self.db.execute("SELECT sender FROM redaction WHERE target=?", (target,))]

    def park_edit(self, event: dict[str, Any], target: str, now_ms: int) -> None:
        self.db.execute("DELETE FROM parked_edit WHERE parked_at<?", (now_ms - PARKED_FOR_MS,))
        self.db.execute("INSERT INTO parked_edit(event_id, target, event, parked_at) VALUES (?,?,?,?)"
                        " ON CONFLICT DO NOTHING",
                        (event["event_id"], target, json.dumps(event), now_ms))
        if self._batch is not None:
            self._batch.parked.add(target)

    def unpark_edits(self, target: str) -> list[dict[str, Any]]:
        """The edits waiting for ``target``, removed from waiting (oldest first)."""
        known = self._known(target)
        if known is not None and target not in known.parked:
            return []
        rows = self.db.execute("SELECT event_id, event FROM parked_edit WHERE target=?"
                               f" ORDER BY parked_at, event_id{self.sql.bytewise}", (target,)).fetchall()
        for event_id, _event in rows:
            self.db.execute("DELETE FROM parked_edit WHERE event_id=?", (event_id,))
            self.db.execute("DELETE FROM processed WHERE event_id=?", (event_id,))
            if self._batch is not None:
                self._batch.processed.discard(event_id)
        return [json.loads(event) for _id, event in rows]

    def is_parked(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM parked_edit WHERE event_id=?", (event_id,)).fetchone() is not None

    def redactions_kept(self, target: str) -> list[tuple[str, str, str, int]]:
        """(event id, room, sender, ts) of each redaction of ``target`` kept, in the room's order."""
        return [tuple(row) for row in self.db.execute(  # type: ignore[misc]
            "SELECT event_id, room_id, sender, ts FROM redaction WHERE target=?"
            f" ORDER BY ts, event_id{self.sql.bytewise}", (target,))]

    def original_of(self, event_id: str) -> str:
        """The event an edit edits (an edit of an edit counts as one of the original)."""
        seen = {event_id}
        while True:  # an edit linked before its own target was known links to that target, an edit
            row = self.db.execute("SELECT original FROM edit_link WHERE event_id=?", (event_id,)).fetchone()
            if row is None or row[0] in seen:
                return event_id
            event_id = row[0]
            seen.add(event_id)

    def link_edit(self, event_id: str, original: str) -> None:
        """Every edit seen, counted or not, so an edit of it finds the original."""
        self.db.execute("INSERT INTO edit_link(event_id, original) VALUES (?, ?)"
                        " ON CONFLICT DO NOTHING", (event_id, original))
