"""The word back (issue 17): each log entry's notice, pending until it is
sent, told within a later coalesced reply, or dropped with its reason
(``answer_log.acked``, ``dropped_notice``); and the bridge's own messages
(``sent``), so a reply to one is read as an answer to its question and a
withdrawal is told where its acknowledgement went.

Pending notices are worked out a window at a time, so a backlog of tens of
thousands (a homeserver slower to take the replies than the answers) costs
a pass neither memory nor time in proportion to it.
"""

from __future__ import annotations

from typing import Iterable

# answer_log.acked: the notice of an entry is pending, sent, told within a
# later coalesced reply, or dropped (its room can't be written to).
PENDING, SENT, COALESCED, DROPPED = 0, 1, 2, 3


class Notices:
    """A part of ``Store`` (store.py): ``answer_log.acked``, ``dropped_notice`` and ``sent``."""

    def notice_pending(self, seqs: list[int]) -> bool:
        """Whether every entry of ``seqs`` still waits for its notice (none: False)."""
        if not seqs:
            return False  # asked before the query: an empty ``IN ()`` is SQLite's alone, PostgreSQL refuses it
        marks = "?" * len(seqs)
        row = self.db.execute(f"SELECT COUNT(*) FROM answer_log WHERE acked=0 AND seq IN ({','.join(marks)})",
                              tuple(seqs)).fetchone()
        return row[0] == len(set(seqs))

    def pending_acks(self, limit: int, skip_rooms: Iterable[str] = ()) -> list[tuple[int, int]]:
        """(last seq, entries) of ``limit`` acknowledgements to send: one per
        person per question for accepted answers (the last one, which stands)
        and one for their additions (notes, files), one per entry otherwise;
        entries whose set is held (dirty) and rooms in ``skip_rooms`` (backed
        off) wait.  Each person in turn, oldest first: one sending many
        messages waits behind everyone else's oldest, never the other way."""
        rooms = list(skip_rooms)
        return self.db.execute(
            "SELECT MAX(seq), COUNT(*) FROM answer_log a WHERE acked=0 AND outcome IN ('accepted','annotated','withdrawn')"
            " AND NOT EXISTS (SELECT 1 FROM dirty d WHERE d.set_dir=a.set_dir AND d.qid=a.qid)"
            + (f" AND room_id NOT IN ({','.join('?' * len(rooms))})" if rooms else "") +
            " GROUP BY room_id, sender, question_event_id,"
            " CASE outcome WHEN 'accepted' THEN 0 WHEN 'annotated' THEN -1 ELSE seq END"
            " ORDER BY ROW_NUMBER() OVER (PARTITION BY sender ORDER BY MIN(seq)), MIN(seq) LIMIT ?",
            (*rooms, limit)).fetchall()

    def pending_refusals(self, limit: int, skip_rooms: Iterable[str] = ()) -> list[tuple[int, int, str, str, str | None]]:
        """(last seq, entries, room, sender, question event) of the oldest ``limit``
        refusals to send, one per person per question."""
        rooms = list(skip_rooms)
        return self.db.execute(
            "SELECT MAX(seq), COUNT(*), room_id, sender, question_event_id FROM answer_log"
            " WHERE acked=0 AND outcome='refused'"
            + (f" AND room_id NOT IN ({','.join('?' * len(rooms))})" if rooms else "") +
            " GROUP BY room_id, sender, question_event_id ORDER BY MIN(seq) LIMIT ?", (*rooms, limit)).fetchall()

    def notice_seqs(self, last: int) -> list[int]:
        """The pending entries the notice of entry ``last`` stands for, in the
        room's order (the last is the one that stands: the latest sent, not
        the latest read, which a transaction or a catch-up can hand over out
        of order): for an accepted answer, an addition or a refusal, the same
        person's pending ones of that outcome on that question up to it;
        otherwise itself."""
        row = self.db.execute("SELECT outcome, room_id, sender, question_event_id FROM answer_log WHERE seq=?",
                              (last,)).fetchone()
        if row is None or row[0] not in ("accepted", "annotated", "refused"):
            return [last]
        outcome, room_id, sender, question = row
        same_question = "question_event_id IS NULL" if question is None else "question_event_id=?"
        rows = self.db.execute(
            f"SELECT seq FROM answer_log WHERE acked=0 AND outcome=? AND room_id=? AND sender=? AND {same_question}"
            " AND seq<=? ORDER BY ts, seq", (outcome, room_id, sender, *(() if question is None else (question,)),
                                             last))
        return [seq for (seq,) in rows.fetchall()] or [last]

    def accepted_since(self, seq: int, sender: str, question_event_id: str) -> bool:
        """Whether an answer of ``sender``'s to ``question_event_id`` was accepted after entry ``seq``."""
        return self.db.execute("SELECT 1 FROM answer_log WHERE seq>? AND sender=? AND question_event_id=?"
                               " AND outcome='accepted' LIMIT 1", (seq, sender, question_event_id)).fetchone() \
            is not None

    def mark_acked(self, seq: int, state: int = 1) -> None:
        """``state``: SENT, COALESCED (told in a later reply) or DROPPED."""
        self.db.defer("UPDATE answer_log SET acked=? WHERE seq=?", (state, seq))

    def drop_notice(self, seq: int, room_id: str, reason: str, at_ms: int) -> None:
        self.mark_acked(seq, DROPPED)
        self.db.defer("INSERT INTO dropped_notice(seq, room_id, reason, at) VALUES (?,?,?,?) ON CONFLICT (seq)"
                      " DO UPDATE SET room_id=excluded.room_id, reason=excluded.reason, at=excluded.at",
                      (seq, room_id, reason, at_ms))

    def dropped_notices(self, limit: int = 50) -> list[tuple[int, str, str, int]]:
        """(seq, room, reason, when) of the latest notices given up on."""
        return self.db.execute("SELECT seq, room_id, reason, at FROM dropped_notice ORDER BY seq DESC LIMIT ?",
                               (limit,)).fetchall()

    def record_sent(self, event_id: str, room_id: str, *, question_event_id: str | None, about: str | None = None,
                    kind: str = "notice") -> None:
        """One of the bridge's own messages, and what it is about."""
        self.db.defer("INSERT INTO sent(event_id, room_id, question_event_id, about, kind)"
                      " VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING", (event_id, room_id, question_event_id, about, kind))

    def sent_question(self, event_id: str) -> str | None:
        """The question a message the bridge sent is about (None: not the bridge's, or about none)."""
        row = self.db.execute("SELECT question_event_id FROM sent WHERE event_id=?", (event_id,)).fetchone()
        return row[0] if row else None

    def acknowledgement_of(self, event_id: str) -> str | None:
        """The bridge's latest word back on a person's event."""
        row = self.db.execute("SELECT event_id FROM sent WHERE about=? ORDER BY rowid DESC LIMIT 1",
                              (event_id,)).fetchone()
        return row[0] if row else None
