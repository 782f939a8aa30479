"""The answer log (``answer_log``): one entry per outcome of a person's
gesture at a question (accepted, annotated, refused, withdrawn), the source
of truth that answers.json is a projection of (``projection.py``).

Entries are read in the room's order (origin_server_ts, then arrival):
an edit shadows the versions before it instead of withdrawing them
(``withdrawals.py``); each entry's notice is tracked in ``acked``
(``notices.py``); each outcome appends its leaf to the verifiable log in the
same transaction (``leaves.py``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from bridge.service.storage.auditlog import LAST_LOGGED, LastLogged


@dataclass(frozen=True)
class LogEntry:
    """One entry of the answer log, as written (``append_log``) and read back."""

    event_id: str
    room_id: str
    sender: str
    via: str
    outcome: str
    set_id: str | None = None
    set_dir: str | None = None
    qid: str | None = None
    question_event_id: str | None = None
    layer: str | None = None
    reason: str | None = None
    message: str | None = None
    record: dict[str, Any] | None = None
    ts: int = 0
    replaces: str | None = None  # the event an edit replaced
    carry_note: str | None = None  # a pick's note that a later pick without words keeps
    thread_root: str | None = None  # the thread the person's event was sent in
    # In encrypted rooms, the sending device: {"device_id", "cross_signed"} (for the answer log's leaf).
    device: dict[str, Any] | None = None


_LOG_ENTRY = ("seq, event_id, room_id, sender, via, outcome, set_id, set_dir, qid, question_event_id, layer, reason,"
              " message, record, ts, replaces, thread_root")


# ``_LOG_ENTRY``'s column names, in its order: a row read with it is mapped by name.
_LOG_ENTRY_COLUMNS = tuple(name.strip() for name in _LOG_ENTRY.split(","))
# The columns ``accepted_answer`` reads, in its SELECT's order.
_ACCEPTED_ANSWER_COLUMNS = ("event_id", "room_id", "sender", "via", "outcome", "set_id", "set_dir", "qid",
                            "question_event_id", "record", "ts")
_ACCEPTED_ANSWER_SELECT = "SELECT " + ", ".join(_ACCEPTED_ANSWER_COLUMNS)


def _entry(columns: tuple[str, ...], row: tuple[Any, ...]) -> LogEntry:
    """A row of answer_log ``columns`` as the entry, each column given to the
    field of its name (``record`` decoded from JSON; ``seq`` is no field)."""
    fields = dict(zip(columns, row))
    fields.pop("seq", None)
    record = fields.pop("record", None)
    return LogEntry(**fields, record=json.loads(record) if record else None)


def _log_entry(r: tuple[Any, ...]) -> LogEntry:
    """A row of ``_LOG_ENTRY`` columns (its seq first) as the entry."""
    return _entry(_LOG_ENTRY_COLUMNS, r)


# Refusals for what an event carried or caused, not for what it said.
SET_ASIDE_REASONS = ("internal_error", "unstorable")
# Answers ever accepted for a question (``accepted_count``, ``Projection.projection``).
_ACCEPTED_COUNT = "SELECT COUNT(*) FROM answer_log WHERE set_dir=? AND qid=? AND outcome='accepted'"
_APPEND = ("INSERT INTO answer_log(event_id, room_id, sender, set_id, set_dir, qid, question_event_id, via, outcome,"
           " layer, reason, message, record, ts, replaces, carry_note, noted, thread_root)"
           " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")


def _row(entry: LogEntry) -> tuple[Any, ...]:
    """``entry`` as ``_APPEND`` inserts it."""
    return (entry.event_id, entry.room_id, entry.sender, entry.set_id, entry.set_dir, entry.qid,
            entry.question_event_id, entry.via, entry.outcome, entry.layer, entry.reason, entry.message,
            None if entry.record is None else json.dumps(entry.record), entry.ts, entry.replaces,
            entry.carry_note, int(entry.outcome == "accepted" and bool((entry.record or {}).get("note"))),
            entry.thread_root)


class AnswerLog:
    """A part of ``Store`` (store.py): ``answer_log``'s entries, written and
    read; answers accepted are counted once a batch (``Store.know_batch``)."""

    def append_log(self, entry: LogEntry) -> int:
        """Log ``entry`` (with its leaf); its ``seq``, read back (a round trip on PostgreSQL)."""
        seq = self.db.execute(_APPEND + " RETURNING seq", _row(entry)).fetchone()[0]
        self._logged(entry, seq)
        return seq

    def log(self, entry: LogEntry) -> None:
        """``append_log`` for a caller that needs no ``seq``: on PostgreSQL sent
        with the next statement that waits (its leaf reads the ``seq`` itself)."""
        self.db.defer(_APPEND, _row(entry))
        self._logged(entry, LAST_LOGGED)

    def _logged(self, entry: LogEntry, seq: "int | LastLogged") -> None:
        if entry.outcome in ("accepted", "annotated", "withdrawn") and entry.set_dir and entry.qid:
            self.mark_dirty((entry.set_dir, entry.set_id, entry.qid))
        if entry.outcome == "accepted" and self._batch is not None and (entry.set_dir, entry.qid) in self._batch.counts:
            self._batch.counts[(entry.set_dir, entry.qid)] += 1
        self.append_leaf(entry, seq)

    def additions_by(self, set_dir: str, qid: str, sender: str) -> int:
        """How many of ``sender``'s additions (notes, files) to a question stand."""
        return self.db.execute(
            "SELECT COUNT(*) FROM answer_log WHERE set_dir=? AND qid=? AND sender=? AND outcome='annotated'"
            " AND withdrawn=0 AND shadowed=0 AND record IS NOT NULL", (set_dir, qid, sender)).fetchone()[0]

    def logged_sender(self, event_id: str) -> str | None:
        row = self.db.execute("SELECT sender FROM answer_log WHERE event_id=? LIMIT 1", (event_id,)).fetchone()
        return row[0] if row else None

    def sender_of(self, event_id: str) -> str | None:
        """Who sent an event the bridge has logged, holds undecrypted, or parked."""
        for query in ("SELECT sender FROM answer_log WHERE event_id=? LIMIT 1",
                      "SELECT sender FROM undecrypted WHERE event_id=?"):
            row = self.db.execute(query, (event_id,)).fetchone()
            if row:
                return row[0]
        # A parked edit is kept whole (JSON); its sender is read in Python, the same on both backends.
        row = self.db.execute("SELECT event FROM parked_edit WHERE event_id=?", (event_id,)).fetchone()
        sender = json.loads(row[0]).get("sender") if row else None
        return sender if isinstance(sender, str) else None

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        """(question event id, via) of the latest log entry about ``event_id``, whatever its outcome."""
        row = self.db.execute(
            "SELECT question_event_id, via FROM answer_log WHERE event_id=? AND question_event_id IS NOT NULL"
            " ORDER BY seq DESC LIMIT 1", (event_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def thread_of(self, event_id: str) -> str | None:
        """The thread the person's event ``event_id`` was sent in, as its log entry has it."""
        row = self.db.execute("SELECT thread_root FROM answer_log WHERE event_id=? AND thread_root IS NOT NULL"
                              " LIMIT 1", (event_id,)).fetchone()
        return row[0] if row else None

    def gesture_at(self, event_id: str) -> tuple[str, str] | None:
        """(question event id, sender) of a person's logged gesture at a question."""
        row = self.db.execute(
            "SELECT question_event_id, sender FROM answer_log WHERE event_id=? AND question_event_id IS NOT NULL"
            " ORDER BY seq DESC LIMIT 1", (event_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def accepted_count(self, set_dir: str, qid: str) -> int:
        """Answers ever accepted for a question: the next one's record ``rev`` is this plus one."""
        batch = self._batch  # counted once a batch, then by this store's inserts
        if batch is not None and (set_dir, qid) in batch.counts:
            return batch.counts[(set_dir, qid)]
        count = self.db.execute(_ACCEPTED_COUNT, (set_dir, qid)).fetchone()[0]
        if batch is not None:
            batch.counts[(set_dir, qid)] = count
        return count

    def closed_at(self, question_event_id: str) -> int | None:
        """When the posting was closed otherwise than by an outcome (withdrawn,
        replaced, removed), as its log's close says; None without one."""
        row = self.db.execute(
            "SELECT ts FROM answer_log WHERE event_id=? AND outcome='closed' ORDER BY seq DESC LIMIT 1",
            (question_event_id,)).fetchone()
        return row[0] if row else None

    def standing_before(self, set_dir: str, qid: str, event_id: str) -> str | None:
        """The sender of the answer to the question that stands just before
        ``event_id``'s in the room's order (not withdrawn, not an edited
        original); None when there is none."""
        row = self.db.execute(
            "SELECT ts, seq FROM answer_log WHERE event_id=? AND outcome='accepted' ORDER BY seq DESC LIMIT 1",
            (event_id,)).fetchone()
        if row is None:
            return None
        before = self.db.execute(
            "SELECT sender FROM answer_log WHERE set_dir=? AND qid=? AND outcome='accepted' AND withdrawn=0"
            " AND shadowed=0 AND event_id<>? AND (ts<? OR (ts=? AND seq<?)) ORDER BY ts DESC, seq DESC LIMIT 1",
            (set_dir, qid, event_id, row[0], row[0], row[1])).fetchone()
        return before[0] if before else None

    def edited_counted(self, original: str, edit_event_id: str, outcome: str = "accepted") -> bool:
        """Whether the message ``edit_event_id`` edits had counted before it
        (as an answer; ``outcome`` "annotated": as an addition): the
        original, or an earlier edit of it, so logged and not withdrawn.  An
        edit of a message refused is the person's first answer (or
        addition) there, not a change of one."""
        row = self.db.execute(
            "SELECT ts, seq FROM answer_log WHERE event_id=? ORDER BY seq DESC LIMIT 1", (edit_event_id,)).fetchone()
        if row is None:
            return False
        return self.db.execute(
            "SELECT 1 FROM answer_log WHERE (event_id=? OR replaces=?) AND event_id<>? AND outcome=?"
            " AND withdrawn=0 AND (ts<? OR (ts=? AND seq<?)) LIMIT 1",
            (original, original, edit_event_id, outcome, row[0], row[0], row[1])).fetchone() is not None

    def accepted_answer(self, event_id: str) -> LogEntry | None:
        row = self.db.execute(
            _ACCEPTED_ANSWER_SELECT + " FROM answer_log WHERE event_id=? AND outcome='accepted'"
            " ORDER BY seq DESC LIMIT 1",
            (event_id,)).fetchone()
        if not row:
            return None
        return _entry(_ACCEPTED_ANSWER_COLUMNS, row)

    def poll_vote_before(self, question_event_id: str, sender: str, ts: int) -> LogEntry | None:
        """``sender``'s latest vote in the question's poll at or before ``ts``
        in the room's order: the one an empty vote then took back."""
        row = self.db.execute(
            _ACCEPTED_ANSWER_SELECT + " FROM answer_log WHERE question_event_id=? AND sender=? AND via='poll'"
            " AND outcome='accepted' AND ts<=?"
            " ORDER BY ts DESC, seq DESC LIMIT 1", (question_event_id, sender, ts)).fetchone()
        return _entry(_ACCEPTED_ANSWER_COLUMNS, row) if row else None

    def standing_pick_sender(self, set_dir: str, qid: str) -> str | None:
        """Who gave the answer to the question that stands (the latest in the
        room's order, not withdrawn, not an edited original): what a note is
        added to.  None when none stands."""
        row = self.db.execute(
            "SELECT sender FROM answer_log WHERE set_dir=? AND qid=? AND outcome='accepted' AND withdrawn=0"
            " AND shadowed=0 ORDER BY ts DESC, seq DESC LIMIT 1", (set_dir, qid)).fetchone()
        return row[0] if row else None

    def has_answered(self, set_dir: str, qid: str, question_event_id: str, sender: str) -> bool:
        """Whether ``sender`` has an answer to this posting of the question that stands."""
        return self.db.execute(
            "SELECT 1 FROM answer_log WHERE set_dir=? AND qid=? AND outcome='accepted' AND question_event_id=?"
            " AND sender=? AND withdrawn=0 AND shadowed=0 LIMIT 1",
            (set_dir, qid, question_event_id, sender)).fetchone() is not None

    def log_entry(self, seq: int) -> LogEntry | None:
        row = self.db.execute(f"SELECT {_LOG_ENTRY} FROM answer_log WHERE seq=?", (seq,)).fetchone()
        return _log_entry(row) if row else None

    def latest_recording(self, set_dir: str, qid: str) -> int | None:
        """The seq of the newest entry that puts something into the question's record."""
        row = self.db.execute(
            "SELECT seq FROM answer_log WHERE set_dir=? AND qid=? AND outcome IN ('accepted','annotated')"
            " AND withdrawn=0 ORDER BY seq DESC LIMIT 1", (set_dir, qid)).fetchone()
        return row[0] if row else None

    def set_aside_entry(self, seq: int, reason: str, message: str) -> None:
        """Turn a logged answer that can't be projected into a refusal (the
        log keeps the rest of it); its person is told, even if told before."""
        row = self.db.execute("SELECT set_dir, set_id, qid FROM answer_log WHERE seq=?", (seq,)).fetchone()
        entry = self.log_entry(seq)
        self.db.execute("UPDATE answer_log SET outcome='refused', layer='recorded', reason=?, message=?, acked=0"
                        " WHERE seq=?", (reason, message, seq))
        if self._batch is not None:
            self._batch.counts.clear()
        self._carried = None  # a count changed that no memo follows
        if entry is not None:
            self.append_leaf(dataclasses.replace(entry, reason=reason, record=None), seq, outcome="set_aside")
        if row and row[0] and row[2]:
            self.mark_dirty(tuple(row))

    def set_aside_counts(self) -> dict[str, int]:
        """reason -> events set aside for it (refused for what they carried, not for what they said)."""
        return dict(self.db.execute(
            "SELECT reason, COUNT(*) FROM answer_log WHERE outcome='refused' AND reason IN (%s) GROUP BY reason"
            % ",".join("?" * len(SET_ASIDE_REASONS)), SET_ASIDE_REASONS).fetchall())

    def log_counts(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT outcome, COUNT(*) FROM answer_log GROUP BY outcome").fetchall())
