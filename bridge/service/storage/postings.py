"""The postings (``posted``): each question event the bridge put into a
room, its set folder, its poll, whether it is open and why it was closed.

Postings belong to a set folder and are found newest first by posting
order, whatever their rev.  What is posted never changes (a new revision is
a new event), so a posting being answered is parsed once and kept
(``_recorded``), from the same read that looks it up; only whether it is
open is read every time, and a batch remembers what it looked up
(``Store.know_batch``) until any posting changes.
A close, a decision and an expiry are outcomes the answer log records.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import Any

from bridge.protocol.approval_record import outcome_mark
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.answerlog import _ACCEPTED_COUNT, LogEntry

# The columns a posting is read with (``_question``).
_Q = "event_id, room_id, set_id, content, open, closed_why"
# The newest posting of a set folder's question, as ``_posting`` reads it.
_LATEST_POSTED = "SELECT event_id, open, closed_why FROM posted WHERE set_dir=? AND qid=? ORDER BY rowid DESC LIMIT 1"
# A posting's question's accepted answers (``_ACCEPTED_COUNT``), as a subselect of a read of ``posted p``.
_ACCEPTED_COUNT_OF_POSTING = ("SELECT COUNT(*) FROM answer_log a WHERE a.set_dir=p.set_dir AND a.qid=p.qid"
                              " AND a.outcome='accepted'")
# A posting with its question's accepted count, the ids it is looked up by
# (``Postings.postings_reads``) and what ``_recorded`` parses (``_keep_parsed``):
# the first answer to a question waits for no read of its own for it.
_POSTING_WITH_COUNT = (f"SELECT event_id, open, closed_why, set_dir, qid, ({_ACCEPTED_COUNT_OF_POSTING}),"
                       " elicitation_id, poll_event_id, room_id, set_id, content FROM posted p")
# What a posting is looked up by, as ``_one`` keys it, and the column of _POSTING_WITH_COUNT holding it.
_LOOKED_UP_BY = (("elicitation_id=?", 6), ("event_id=?", 0), ("poll_event_id=?", 7))
# Posted questions kept parsed: the ones being answered now, not every one ever posted.
_RECENT_QUESTIONS = 512


class PostingConflict(Exception):
    """A posting clashes with one already recorded (same event or elicitation id)."""


class Postings:
    """A part of ``Store`` (store.py): the ``posted`` table, and the meta
    rows of a posting's deadline passed and approval outcome logged."""

    def record_posted(self, question: RecordedQuestion, *, set_dir: str, posted_at: int,
                      poll_event_id: str | None = None) -> None:
        """Record a posting.  A clash with a posting already recorded (the same
        event, or the same elicitation id) is never ignored: it raises
        PostingConflict, naming both, and nothing is recorded."""
        content = question.content
        event_id, elicitation_id, qid = question.event_id, content["elicitation_id"], content["question"]["id"]
        # Looked up before the insert, not after it fails: on PostgreSQL a
        # failed statement aborts the transaction, so nothing could be read
        # to name the clash.  (Writers take turns: nothing comes in between.)
        # The question's accepted count comes with it, for ``_learned``.
        clash, count = self.db.reads([
            ("SELECT event_id, set_dir, qid, rev FROM posted WHERE event_id=? OR elicitation_id=?"
             " ORDER BY rowid LIMIT 1", (event_id, elicitation_id)),
            (_ACCEPTED_COUNT, (set_dir, qid))])
        if clash:
            row = clash[0]
            raise PostingConflict(f"posting {event_id} ({elicitation_id}) clashes with the posting"
                                  f" already recorded: {row[0]} of {row[1]}/{row[2]} rev {row[3]}")
        stored = json.dumps(content)
        try:
            self.db.execute(
                "INSERT INTO posted(event_id, room_id, set_id, set_dir, qid, rev, elicitation_id, content,"
                " open, poll_event_id, posted_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (event_id, question.room_id, question.set_id, set_dir, qid, content["question"]["rev"],
                 elicitation_id, stored, int(question.open), poll_event_id, posted_at),
            )
        except sqlite3.IntegrityError:  # a posting missing a part the table requires
            raise PostingConflict(f"posting {event_id} could not be recorded") from None
        # Kept parsed as a read would find it (``_recorded``), and known to later batches (``_learned``).
        posting = (event_id, int(question.open), None)
        self._keep(_question((event_id, question.room_id, question.set_id, stored, *posting[1:])), set_dir)
        keys = [("event_id=?", event_id), ("elicitation_id=?", elicitation_id),
                *([("poll_event_id=?", poll_event_id)] if poll_event_id else [])]
        self._postings_changed(learned=lambda known: _learned(known, keys, posting, (set_dir, qid), count[0][0]))

    def set_poll(self, event_id: str, poll_event_id: str) -> None:
        self.db.execute("UPDATE posted SET poll_event_id=? WHERE event_id=?", (poll_event_id, event_id))
        self._postings_changed(learned=lambda known: _poll_learned(known, event_id, poll_event_id))

    def close_question(self, event_id: str, why: str | None = None, *, by: str = "",
                       outcome: str | None = None, record: dict[str, Any] | None = None,
                       at: int | None = None) -> None:
        """Close a posting; the answer log records it: as ``outcome`` when the
        close is an approval's (``decided``, or ``expired`` undecided at its
        deadline: outcomes of their own in the log, with ``record``, what the
        question's record says of it), otherwise as a close (``by``: who
        closed it, the bridge when empty; ``at``: when in the room's time,
        a deadline's, else now)."""
        row = self.db.execute("SELECT room_id, set_id, open FROM posted WHERE event_id=?", (event_id,)).fetchone()
        self.db.execute("UPDATE posted SET open=0, closed_why=? WHERE event_id=?", (why, event_id))
        self._postings_changed()
        if outcome is not None:
            self.log_approval_outcome(event_id, outcome, record)
        elif row is not None and row[2]:
            # The close happens now (no room event carries it), hence the clock.
            self.append_leaf(LogEntry(event_id, row[0], by, "bridge", "closed", set_id=row[1],
                                      question_event_id=event_id, reason=why,
                                      ts=self.clock.now_ms() if at is None else at), None)

    def log_approval_outcome(self, event_id: str, outcome: str, record: dict[str, Any] | None = None) -> bool:
        """The posting's approval outcome (``decided`` or ``expired``) is now
        ``outcome``, as ``record`` has it (its leaf hashes the decision:
        ``audit_leaf.OUTCOME_FIELDS``): when that differs from the last one
        the log recorded for it, the log gets its leaf.  The record can
        change after the question closed (an earlier event read late), so
        this is asked wherever the record is written; True when a leaf was
        appended.  (A record that is neither again, pending, needs no leaf:
        verify asks the log's latest word only of a decided or expired
        record.)"""
        key = f"approval_logged:{event_id}"
        mark = outcome_mark(outcome, record)
        if self.get_meta(key) == mark:
            return False
        row = self.db.execute("SELECT room_id, set_id FROM posted WHERE event_id=?", (event_id,)).fetchone()
        if row is not None:
            self.append_leaf(LogEntry(event_id, row[0], "", "bridge", outcome, set_id=row[1], record=record,
                                      question_event_id=event_id, reason=outcome, ts=self.clock.now_ms()), None)
        self.set_meta(key, mark)
        return True

    def approval_outcome_logged(self, event_id: str) -> str | None:
        """The ``outcome_mark`` of the approval outcome the log last recorded for the posting."""
        return self.get_meta(f"approval_logged:{event_id}")

    def question_by_event(self, event_id: str) -> RecordedQuestion | None:
        return self._one("event_id=?", event_id)

    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None:
        return self._one("elicitation_id=?", elicitation_id)

    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None:
        return self._one("poll_event_id=?", poll_event_id)

    def latest_posted(self, set_dir: str, qid: str) -> RecordedQuestion | None:
        """The newest posting of a set folder's question, whatever its rev."""
        return self._posting(self.db.execute(_LATEST_POSTED, (set_dir, qid)).fetchone())

    def postings(self, set_dir: str, qid: str) -> list[RecordedQuestion]:
        """Every posting of a set folder's question, newest posted first."""
        rows = self.db.execute(f"SELECT {_Q} FROM posted WHERE set_dir=? AND qid=? ORDER BY rowid DESC",
                               (set_dir, qid)).fetchall()
        return [_question(row) for row in rows]

    def posted_for_set(self, set_dir: str) -> list[tuple[RecordedQuestion, str | None]]:
        """Every posting of a set folder, oldest first, with its poll."""
        rows = self.db.execute(f"SELECT {_Q}, poll_event_id FROM posted WHERE set_dir=? ORDER BY rowid",
                               (set_dir,)).fetchall()
        return [(_question(row[:-1]), row[-1]) for row in rows]

    def folders_of_set(self, set_id: str) -> list[str]:
        """The set folders that posted under ``set_id``, first poster first."""
        rows = self.db.execute("SELECT set_dir, MIN(rowid) AS first FROM posted WHERE set_id=? GROUP BY set_dir"
                               " ORDER BY first", (set_id,)).fetchall()
        return [row[0] for row in rows]

    def folders_with_open(self) -> list[str]:
        """The set folders that still have an open posting."""
        return [row[0] for row in self.db.execute(  # in byte order (the order removed sets are closed in)
            f"SELECT set_dir FROM posted WHERE open=1 GROUP BY set_dir ORDER BY set_dir{self.sql.bytewise}").fetchall()]

    def folders_posted(self) -> list[str]:
        """Every set folder that ever posted a question."""
        return [row[0] for row in self.db.execute("SELECT DISTINCT set_dir FROM posted").fetchall()]

    def set_folders(self) -> list[tuple[str, str]]:
        """(set folder, set id) of every folder that ever posted a question."""
        return [(row[0], row[1]) for row in
                self.db.execute("SELECT DISTINCT set_dir, set_id FROM posted ORDER BY set_dir").fetchall()]

    def rooms_with_open(self) -> list[str]:
        """The rooms that still have an open posting (their answers count
        wherever the config says new sets go now)."""
        return [row[0] for row in self.db.execute("SELECT DISTINCT room_id FROM posted WHERE open=1").fetchall()]

    def open_set_rooms(self) -> list[tuple[str, str]]:
        """(set id, room) of every room a set has an open posting in."""
        return [(row[0], row[1]) for row in self.db.execute(
            "SELECT DISTINCT set_id, room_id FROM posted WHERE open=1").fetchall()]

    def set_dir_of(self, event_id: str) -> str | None:
        kept = self._recent_questions.get(event_id)
        if kept is not None:
            return kept[1]
        row = self.db.execute("SELECT set_dir FROM posted WHERE event_id=?", (event_id,)).fetchone()
        return row[0] if row else None

    def poll_of(self, event_id: str) -> str | None:
        row = self.db.execute("SELECT poll_event_id FROM posted WHERE event_id=?", (event_id,)).fetchone()
        return row[0] if row else None

    def count_posted(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM posted").fetchone()[0]

    @staticmethod
    def postings_reads(elicitations: list[str], targets: list[str]) -> list[tuple[str, list[str]]]:
        """The reads of the postings a batch's events may be looked up by
        (elicitation ids; events related to, as a posting or its poll), in
        ``_LOOKED_UP_BY``'s order, for ``know_postings``."""
        return [(f"{_POSTING_WITH_COUNT} WHERE {where[:-2]} IN ({','.join('?' * len(values)) or 'NULL'})", values)
                for (where, _column), values in zip(_LOOKED_UP_BY, (elicitations, targets, targets))]

    @staticmethod
    def looked_up(elicitations: list[str], targets: list[str]) -> list[tuple[str, str]]:
        """The (where, value) keys ``postings_reads`` reads, as ``_one`` finds them."""
        return [(where, value) for (where, _column), values in zip(_LOOKED_UP_BY, (elicitations, targets, targets))
                for value in values]

    def know_postings(self, batch: Any, rows: list[list[tuple]], elicitations: list[str], targets: list[str]) -> None:
        """What ``postings_reads`` read, into the batch's memo: every id asked
        about, found or not, and each found posting's count."""
        for (where, column), values, found in zip(_LOOKED_UP_BY, (elicitations, targets, targets), rows):
            for value in values:
                batch.postings.setdefault((where, value), None)
            for row in found:
                self._keep_parsed(row)
                Postings._remember(batch, (where, row[column]), row)

    @staticmethod
    def _remember(batch: Any, key: tuple[str, str], row: tuple) -> tuple:
        """A ``_POSTING_WITH_COUNT`` row into the batch's memo, found by ``key``
        and by its event id, with its question's count; the posting's row."""
        posting = tuple(row[:3])
        batch.postings[key] = posting
        batch.postings[("event_id=?", row[0])] = posting
        batch.questions[row[0]] = (row[3], row[4])
        batch.counts.setdefault((row[3], row[4]), row[5])
        return posting

    def _one(self, where: str, value: str) -> RecordedQuestion | None:
        batch = self._batch
        row = batch.postings.get((where, value), False) if batch is not None else False
        if row is not False:
            return self._posting(row)
        if batch is None:
            row = self.db.execute(f"SELECT event_id, open, closed_why FROM posted WHERE {where}", (value,)).fetchone()
            return self._posting(row)
        # Not asked yet in this batch (a question is looked up by each answer's
        # parts).  An answer to it is counted next: the count comes with it.
        found = self.db.execute(f"{_POSTING_WITH_COUNT} WHERE {where}", (value,)).fetchone()
        if found is None:
            batch.postings[(where, value)] = None
            return None
        self._keep_parsed(found)
        return self._posting(self._remember(batch, (where, value), found))

    def _posting(self, row: Any) -> RecordedQuestion | None:
        """A posting from its (event id, open, closed_why) row, or None for no row."""
        if not row:
            return None
        event_id, is_open, closed_why = row
        return self._recorded(event_id, bool(is_open), closed_why)

    def _recorded(self, event_id: str, is_open: bool, closed_why: str | None = None) -> RecordedQuestion:
        """The posted question ``event_id``, parsed once while it is answered.

        Every answer looks its question up; parsing the posted content and
        working out its options again for each one cost more than judging.
        What is posted never changes (a new revision is a new event), so only
        ``open`` is read from the table every time."""
        kept = self._recent_questions.get(event_id)
        if kept is None:
            row = self.db.execute(f"SELECT {_Q}, set_dir FROM posted WHERE event_id=?", (event_id,)).fetchone()
            kept = self._keep(_question(row[:-1]), row[-1])
        else:
            self._recent_questions.move_to_end(event_id)
        question = kept[0]
        if question.open == is_open and question.closed_why == closed_why:
            return question
        return dataclasses.replace(question, open=is_open, closed_why=closed_why)

    def _keep_parsed(self, row: tuple) -> None:
        """A ``_POSTING_WITH_COUNT`` row's posting kept parsed for ``_recorded``, unless it is already."""
        if row[0] not in self._recent_questions:
            event_id, is_open, closed_why, set_dir, *_rest, room_id, set_id, content = row
            self._keep(_question((event_id, room_id, set_id, content, is_open, closed_why)), set_dir)

    def _keep(self, question: RecordedQuestion, set_dir: str) -> tuple[RecordedQuestion, str]:
        recent = self._recent_questions
        recent[question.event_id] = kept = (question, set_dir)
        while len(recent) > _RECENT_QUESTIONS:
            recent.popitem(last=False)
        return kept

    def mark_expired(self, question_event_id: str, at_ms: int) -> None:
        """The posting reached its deadline (the bridge closed it, or the homeserver's own closing came)."""
        self.set_meta(f"expired:{question_event_id}", str(at_ms))

    def is_expired(self, question_event_id: str) -> bool:
        return self.get_meta(f"expired:{question_event_id}") is not None


def _learned(known: Any, keys: list[tuple[str, str]], posting: tuple, question: tuple[str, str], count: int) -> None:
    """A posting this process recorded, into what later batches take
    (``guesses``): the first answer to it needs no read of its own.  An
    answer relating to it looks it up as a poll too: no posting's poll."""
    for key in keys:
        known.postings[key] = posting
    known.postings.setdefault(("poll_event_id=?", posting[0]), None)
    known.questions[posting[0]] = question
    known.counts[question] = count


def _poll_learned(known: Any, event_id: str, poll_event_id: str) -> None:
    """A posting's poll, into what later batches take: a vote finds the
    posting by it, and no posting is the poll's own event."""
    posting = known.postings.get(("event_id=?", event_id))
    if posting is None:
        known.postings.pop(("poll_event_id=?", poll_event_id), None)
    else:
        known.postings[("poll_event_id=?", poll_event_id)] = posting
        known.postings.setdefault(("event_id=?", poll_event_id), None)


def _question(row: tuple) -> RecordedQuestion:
    """A row of ``_Q`` columns as the posting (its content decoded from JSON)."""
    event_id, room_id, set_id, content, is_open, closed_why = row
    return RecordedQuestion(event_id=event_id, room_id=room_id, set_id=set_id, content=json.loads(content),
                            open=bool(is_open), closed_why=closed_why)
