"""The bridge's store (SQLite, or PostgreSQL through ``pgdialect``): what it posted, what it has seen, and why.

The answer log is the source of truth; ``answers.json`` is a projection of
it.  Every batch is committed here before the folder is written, so a crash
between the two is repaired on start by re-projecting the pending questions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from bridge.protocol import audit_leaf
from bridge.protocol.annotate import fold_records
from bridge.protocol.approval_record import approval_record
from bridge.protocol.fit import fit_id
from bridge.protocol.quorum import NEVER, Cast
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.answerlog import _ACCEPTED_COUNT, RECORDING, SET_ASIDE_REASONS, AnswerLog, LogEntry
from bridge.service.storage.attachments import Attachments
from bridge.service.storage.auditlog import AuditLog
from bridge.service.storage.dbclock import DatabaseClock, LocalClock
from bridge.service.storage.handled import Handled
from bridge.service.storage.meta import Meta
from bridge.service.storage.operators import Operators, PostedQuestion
from bridge.service.storage.schema import MIGRATIONS, SCHEMA_VERSION, statements
from bridge.service.storage.storethread import StoreThread
from bridge.service.storage.undecrypted import Undecrypted
from bridge.service.storage.withdrawals import Withdrawals

T = TypeVar("T")

# The store's face: ``Store``, and the names its callers import from here
# (the parts' own modules are where they are defined).
__all__ = ["Store", "StoreVersionError", "LogEntry", "PostedQuestion", "RECORDING", "SET_ASIDE_REASONS"]


def votes_key(question_event_id: str, sender: str) -> str:
    """The redaction target an emptied poll vote is kept under: every vote of one person in one poll."""
    return f"votes\x1f{question_event_id}\x1f{sender}"


class StoreVersionError(Exception):
    pass


class PostingConflict(Exception):
    """A posting clashes with one already recorded (same event or elicitation id)."""


# answer_log.acked: the notice of an entry is pending, sent, told within a
# later coalesced reply, or dropped (its room can't be written to).
PENDING, SENT, COALESCED, DROPPED = 0, 1, 2, 3


@dataclass
class _Batch:
    """What the store knows of a batch's events (``Store.know_batch``): the
    events asked about, those processed, the senders of redactions of each
    (target -> senders), the targets edits wait for, the postings looked
    up so far (forgotten at any change to a posting), the questions made
    dirty and the answers accepted for each question."""

    thread: int  # the thread whose transaction it belongs to
    ids: set[str]
    processed: set[str]
    redacted_by: dict[str, list[str]]
    parked: set[str]
    # Postings looked up in this batch: (where, value) -> their row (event id, open, closed_why) or None.
    postings: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    # Questions made dirty in this batch; answers accepted for each, (set dir, qid) -> count.
    dirtied: set[tuple[str, str, str]] = dataclasses.field(default_factory=set)
    counts: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class FlushView:
    """The store as a flush starts: the dirty questions (set dir, set id,
    qid; oldest first), the latest posting of each by (set dir, qid), the
    held sets' rows (``held_sets``) and the files to delete (``doomed_files``)."""

    dirty: list[tuple[str, str, str]]
    postings: dict[tuple[str, str], RecordedQuestion]
    held: list[tuple[str, str, str, int, int, int]]
    doomed: list[tuple[str, str]]



def _clock_of(db: Any) -> "DatabaseClock | LocalClock":
    """The clock of every time another instance reads (dbclock): PostgreSQL's, or this machine's."""
    return getattr(db, "clock", None) or LocalClock()


class Store(Meta, Handled, AnswerLog, Withdrawals, Attachments, Operators, Undecrypted):
    def __init__(self, path: str | Path, *, url: str | None = None, password: str | None = None):
        """SQLite at ``path``, or PostgreSQL at ``url`` (``store.url``) when given."""
        self.path = Path(path)
        if url:
            from bridge.service.storage.pgdialect import PgConnection, redact  # psycopg only when it is used

            self.path = redact(url)  # type: ignore[assignment] - named in messages only
            self.db = PgConnection(url, password=password)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._own_connection()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self._recent_questions: OrderedDict[str, tuple[RecordedQuestion, str]] = OrderedDict()
        self._origin: str | None = None  # ``audit_origin``, once read
        self._kept_batch: _Batch | None = None  # ``know_batch``
        # Every outcome appends a leaf to the answer log unless ``audit.enabled`` is off.
        self.audit_enabled = True
        self._migrate()

    def _own_connection(self) -> None:
        """``self.db`` used by one thread at a time, and the store's own thread for jobs (``storethread``)."""
        self._thread = StoreThread()
        self.clock = _clock_of(self.db)
        refresh = getattr(self.clock, "refresh", None)
        if refresh is not None:  # PostgreSQL's clock, measured again on the store's connection when it is free
            self.clock.refresh = lambda: self._thread.if_free(refresh)  # type: ignore[union-attr]
        self.db = self._thread.gated(self.db)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (store work, done synchronously) on the
        store's own thread, awaited: the event loop serves everything else
        meanwhile.  Each job is one piece, as a synchronous stretch on the
        loop is (``storethread``)."""
        return await self._thread.run(fn, *args, **kwargs)

    def close(self) -> None:
        self._thread.close()
        self.db.close()

    @classmethod
    def read_only(cls, path: str | Path, *, url: str | None = None, password: str | None = None) -> "Store":
        """A store opened for reading only (``status`` while the bridge runs):
        never created, never migrated.  A store from a newer version is
        refused like on start; FileNotFoundError when there is none."""
        path = Path(path)
        store = cls.__new__(cls)
        store._recent_questions = OrderedDict()
        store._origin = None
        store._kept_batch = None
        store.audit_enabled = False  # nothing is written through a read-only store
        if url:
            from bridge.service.storage.pgdialect import PgConnection, redact

            path = redact(url)  # type: ignore[assignment]
            store.db = PgConnection(url, password=password, read_only=True)
        elif not path.is_file():
            raise FileNotFoundError(str(path))
        else:
            store.db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False, timeout=10)
        store.path = path
        store._own_connection()
        version = store.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            store.db.close()
            raise StoreVersionError(
                f"{path} was written by a newer askwright-bridge (store schema {version}, "
                f"this version knows {SCHEMA_VERSION}); upgrade the bridge or restore a backup"
            )
        return store

    def _migrate(self) -> None:
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreVersionError(
                f"{self.path} was written by a newer askwright-bridge (store schema {version}, "
                f"this version knows {SCHEMA_VERSION}); upgrade the bridge or restore a backup"
            )
        if version == SCHEMA_VERSION:
            return
        unbounded = getattr(self.db, "unbounded", contextlib.nullcontext)  # PostgreSQL's statement timeout
        with unbounded():
            for number in range(version, SCHEMA_VERSION):
                with self.transaction():
                    for statement in statements(MIGRATIONS[number]):
                        self.db.execute(statement)
                    self.db.execute(f"PRAGMA user_version={number + 1}")

    def transaction(self, *, flush: bool = True) -> "_Transaction":
        """BEGIN IMMEDIATE ... COMMIT.  ``flush=False`` commits without waiting
        for the disk: for a transaction that a later, flushed one in the same
        batch always follows before anything relies on it (the WAL is one
        append-only file, so that fsync makes both durable; a power cut in
        between loses both, and the transport delivers the batch again)."""
        return _Transaction(self.db, flush=flush, ended=self._forget_batch)

    def changes(self) -> int:
        """Rows changed through this connection so far (to tell whether a batch changed anything)."""
        return self.db.total_changes

    def savepoint(self) -> "_Savepoint":
        """Inside a transaction: undo just this part when it raises."""
        return _Savepoint(self.db, undone=self._forget_batch)

    # -- a batch's events, looked up at once --------------------------------

    def know_batch(self, event_ids: Iterable[str]) -> None:
        """Inside a transaction, before its events are handled: whether each
        was processed, the redactions that came before it and whether edits
        wait for it, read at once (one round trip on PostgreSQL, not three
        per event).  Kept up to date by this store's writes until the
        transaction ends; any part undone forgets it (the reads go to the
        database again)."""
        # Ids the store can't key by are skipped by the batch itself (``fit_id``), unread.
        ids = sorted({i for i in event_ids if isinstance(i, str) and fit_id(i)})
        reads = []
        for start in range(0, len(ids), _IDS_PER_READ):
            part = ids[start:start + _IDS_PER_READ]
            marks = ",".join("?" * len(part))
            reads += [(f"SELECT event_id FROM processed WHERE event_id IN ({marks})", part),
                      (f"SELECT target, sender FROM redaction WHERE target IN ({marks})", part),
                      (f"SELECT DISTINCT target FROM parked_edit WHERE target IN ({marks})", part)]
        rows = self.db.reads(reads) if reads else []
        known = _Batch(threading.get_ident(), set(ids), set(), {}, set())
        for processed, redactions, parked in zip(rows[0::3], rows[1::3], rows[2::3]):
            known.processed.update(row[0] for row in processed)
            known.parked.update(row[0] for row in parked)
            for target, sender in redactions:
                known.redacted_by.setdefault(target, []).append(sender)
        self._kept_batch = known

    def _forget_batch(self) -> None:
        self._kept_batch = None

    @property
    def _batch(self) -> "_Batch | None":
        """What ``know_batch`` keeps, to the thread whose transaction it belongs
        to only: any other thread's statements wait for that transaction to
        end (the store's thread gate), and so do its reads of what it keeps."""
        batch = self._kept_batch
        return batch if batch is not None and batch.thread == threading.get_ident() else None

    def _dirty(self, question: tuple[str, str, str]) -> None:
        """(set dir, set id, qid) to be written to its answers.json (once a batch is enough)."""
        if self._batch is not None:
            if question in self._batch.dirtied:
                return
            self._batch.dirtied.add(question)
        self.db.defer("INSERT OR IGNORE INTO dirty(set_dir, set_id, qid) VALUES (?,?,?)", question)

    def _postings_changed(self) -> None:
        if self._batch is not None:
            self._batch.postings.clear()

    def _known(self, event_id: str) -> "_Batch | None":
        batch = self._batch
        return batch if batch is not None and event_id in batch.ids else None

    def notice_pending(self, seqs: list[int]) -> bool:
        """Whether every entry of ``seqs`` still waits for its notice (none: False)."""
        if not seqs:
            return False  # asked before the query: an empty ``IN ()`` is SQLite's alone, PostgreSQL refuses it
        marks = "?" * len(seqs)
        row = self.db.execute(f"SELECT COUNT(*) FROM answer_log WHERE acked=0 AND seq IN ({','.join(marks)})",
                              tuple(seqs)).fetchone()
        return row[0] == len(set(seqs))

    # -- posted questions ------------------------------------------------

    def record_posted(self, question: RecordedQuestion, *, set_dir: str, posted_at: int,
                      poll_event_id: str | None = None) -> None:
        """Record a posting.  A clash with a posting already recorded (the same
        event, or the same elicitation id) is never ignored: it raises
        PostingConflict, naming both, and nothing is recorded."""
        content = question.content
        # Looked up before the insert, not after it fails: on PostgreSQL a
        # failed statement aborts the transaction, so nothing could be read
        # to name the clash.  (Writers take turns: nothing comes in between.)
        row = self.db.execute("SELECT event_id, set_dir, qid, rev FROM posted WHERE event_id=? OR elicitation_id=?"
                              " ORDER BY rowid LIMIT 1", (question.event_id, content["elicitation_id"])).fetchone()
        if row is not None:
            raise PostingConflict(f"posting {question.event_id} ({content['elicitation_id']}) clashes with the posting"
                                  f" already recorded: {row[0]} of {row[1]}/{row[2]} rev {row[3]}")
        try:
            self.db.execute(
                "INSERT INTO posted(event_id, room_id, set_id, set_dir, qid, rev, elicitation_id, content,"
                " open, poll_event_id, posted_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (question.event_id, question.room_id, question.set_id, set_dir, content["question"]["id"],
                 content["question"]["rev"], content["elicitation_id"], json.dumps(content), int(question.open),
                 poll_event_id, posted_at),
            )
        except sqlite3.IntegrityError:  # a posting missing a part the table requires
            raise PostingConflict(f"posting {question.event_id} could not be recorded") from None
        self._postings_changed()

    def set_poll(self, event_id: str, poll_event_id: str) -> None:
        self.db.execute("UPDATE posted SET poll_event_id=? WHERE event_id=?", (poll_event_id, event_id))
        self._postings_changed()

    def close_question(self, event_id: str, why: str | None = None, *, by: str = "") -> None:
        """Close a posting; the answer log records it (``by``: who closed it, the bridge when empty)."""
        row = self.db.execute("SELECT room_id, set_id, open FROM posted WHERE event_id=?", (event_id,)).fetchone()
        self.db.execute("UPDATE posted SET open=0, closed_why=? WHERE event_id=?", (why, event_id))
        self._postings_changed()
        if why in ("decided", "expired"):
            # A quorum's decision and an expiry are outcomes of their own in the log.
            self.log_approval_outcome(event_id, why)
        elif row is not None and row[2]:
            # The close happens now (no room event carries it), hence the clock.
            self.append_leaf(LogEntry(event_id, row[0], by, "bridge", "closed", set_id=row[1],
                                      question_event_id=event_id, reason=why, ts=self.clock.now_ms()), None)

    def log_approval_outcome(self, event_id: str, outcome: str) -> bool:
        """The posting's approval outcome (``decided`` or ``expired``) is now
        ``outcome``: when that differs from the last one the log recorded for
        it, the log gets its leaf.  The record can change outcome after the
        question closed (an earlier event read late), so this is asked
        wherever the record is written; True when a leaf was appended.  (A
        record that is neither again, pending, needs no leaf: verify asks
        the log's latest word only of a decided or expired record.)"""
        key = f"approval_logged:{event_id}"
        if self.get_meta(key) == outcome:
            return False
        row = self.db.execute("SELECT room_id, set_id FROM posted WHERE event_id=?", (event_id,)).fetchone()
        if row is not None:
            self.append_leaf(LogEntry(event_id, row[0], "", "bridge", outcome, set_id=row[1],
                                      question_event_id=event_id, reason=outcome, ts=self.clock.now_ms()), None)
        self.set_meta(key, outcome)
        return True

    def approval_outcome_logged(self, event_id: str) -> str | None:
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
            "SELECT set_dir FROM posted WHERE open=1 GROUP BY set_dir ORDER BY set_dir COLLATE BINARY").fetchall()]

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

    def _one(self, where: str, value: str) -> RecordedQuestion | None:
        batch = self._batch
        row = batch.postings.get((where, value), False) if batch is not None else False
        if row is False:  # not asked yet in this batch (a question is looked up by each answer's parts)
            row = self.db.execute(f"SELECT event_id, open, closed_why FROM posted WHERE {where}", (value,)).fetchone()
            if batch is not None:
                batch.postings[(where, value)] = row
                if row is not None:  # found by its elicitation or poll: the same posting by its id
                    batch.postings[("event_id=?", row[0])] = row
        return self._posting(row)

    def _posting(self, row: Any) -> RecordedQuestion | None:
        """A posting from its (event id, open, closed_why) row, or None for no row."""
        return self._recorded(row[0], bool(row[1]), row[2]) if row else None

    def _recorded(self, event_id: str, is_open: bool, closed_why: str | None = None) -> RecordedQuestion:
        """The posted question ``event_id``, parsed once while it is answered.

        Every answer looks its question up; parsing the posted content and
        working out its options again for each one cost more than judging.
        What is posted never changes (a new revision is a new event), so only
        ``open`` is read from the table every time."""
        recent = self._recent_questions
        kept = recent.get(event_id)
        if kept is None:
            row = self.db.execute(f"SELECT {_Q}, set_dir FROM posted WHERE event_id=?", (event_id,)).fetchone()
            kept = (_question(row[:-1]), row[-1])
            recent[event_id] = kept
            while len(recent) > _RECENT_QUESTIONS:
                recent.popitem(last=False)
        else:
            recent.move_to_end(event_id)
        question = kept[0]
        if question.open == is_open and question.closed_why == closed_why:
            return question
        return dataclasses.replace(question, open=is_open, closed_why=closed_why)

    # -- events and the answer log ---------------------------------------

    # -- the verifiable answer log (issue 32) -------------------------------

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.db)

    def append_leaf(self, entry: LogEntry, seq: int | None, *, outcome: str | None = None) -> None:
        """The answer log's leaf for ``entry`` (``outcome`` when it differs
        from the entry's: a later decision about it), appended in the caller's
        transaction (none with ``audit.enabled`` off).  Every place an outcome
        is recorded makes this one call."""
        if not self.audit_enabled:
            return
        question = self.question_by_event(entry.question_event_id) if entry.question_event_id else None
        leaf = audit_leaf.build_leaf(
            outcome=outcome or entry.outcome, set_id=entry.set_id, room_id=entry.room_id, event_id=entry.event_id,
            sender=entry.sender, ts=entry.ts, via=entry.via, question=question.content if question else None,
            question_event_id=entry.question_event_id, replaces=entry.replaces, device=entry.device,
            record=entry.record, reason=entry.reason)
        self.audit.append(leaf, seq)

    def drop_parked(self, event_id: str) -> None:
        self.db.execute("DELETE FROM parked_edit WHERE event_id=?", (event_id,))

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
        self.db.execute("INSERT OR IGNORE INTO edit_link(event_id, original) VALUES (?, ?)", (event_id, original))

    # -- what waits for its target ----------------------------------------

    def keep_redaction(self, event_id: str, target: str, room_id: str, sender: str, ts: int) -> None:
        kept = self.db.execute("INSERT OR IGNORE INTO redaction(event_id, target, room_id, sender, ts)"
                               " VALUES (?,?,?,?,?)", (event_id, target, room_id, sender, ts)).rowcount
        if self._batch is not None and kept > 0:
            self._batch.redacted_by.setdefault(target, []).append(sender)

    def redacted_since(self, target: str, ts: int) -> bool:
        return self.redaction_since(target, ts) is not None

    def redaction_since(self, target: str, ts: int) -> tuple[str, int] | None:
        """(event id, ts) of the first redaction of ``target`` at or after ``ts``."""
        row = self.db.execute("SELECT event_id, ts FROM redaction WHERE target=? AND ts>=?"
                              " ORDER BY ts, event_id COLLATE BINARY LIMIT 1", (target, ts)).fetchone()
        return (row[0], row[1]) if row else None

    def redactions_of(self, target: str) -> list[str]:
        """The senders of redactions that came before their target."""
        known = self._known(target)
        if known is not None:
            return list(known.redacted_by.get(target, ()))
        return [row[0] for row in self.db.execute("SELECT sender FROM redaction WHERE target=?", (target,))]

    def park_edit(self, event: dict[str, Any], target: str, now_ms: int) -> None:
        self.db.execute("DELETE FROM parked_edit WHERE parked_at<?", (now_ms - PARKED_FOR_MS,))
        self.db.execute("INSERT OR IGNORE INTO parked_edit(event_id, target, event, parked_at) VALUES (?,?,?,?)",
                        (event["event_id"], target, json.dumps(event), now_ms))
        if self._batch is not None:
            self._batch.parked.add(target)

    def unpark_edits(self, target: str) -> list[dict[str, Any]]:
        """The edits waiting for ``target``, removed from waiting (oldest first)."""
        known = self._known(target)
        if known is not None and target not in known.parked:
            return []
        rows = self.db.execute("SELECT event_id, event FROM parked_edit WHERE target=?"
                               " ORDER BY parked_at, event_id COLLATE BINARY", (target,)).fetchall()
        for event_id, _event in rows:
            self.db.execute("DELETE FROM parked_edit WHERE event_id=?", (event_id,))
            self.db.execute("DELETE FROM processed WHERE event_id=?", (event_id,))
            if self._batch is not None:
                self._batch.processed.discard(event_id)
        return [json.loads(event) for _id, event in rows]

    def doomed_files(self) -> list[tuple[str, str]]:
        return self.db.execute(_DOOMED).fetchall()

    def forget_doomed(self, set_dir: str, path: str) -> None:
        self.db.defer("DELETE FROM doomed_file WHERE set_dir=? AND path=?", (set_dir, path))

    def projection(self, set_dir: str, qid: str) -> dict[str, Any] | None:
        """The record answers.json should hold for a question, from the log in
        the room's order (see ``annotate.fold_records``); its ``rev`` the
        number of answers ever accepted for the question (a note is not an
        answer, so a note-only record is rev 1).

        Its reads go out together (one round trip on PostgreSQL): a written
        answer costs one, not one per read."""
        live = "set_dir=? AND qid=? AND withdrawn=0 AND shadowed=0 AND record IS NOT NULL"
        # The standing pick is the latest in the room; when it has no note of
        # its own, the latest earlier pick with one (or from before the
        # notes were kept apart) is the one whose note it keeps: of the two
        # latest noted picks, the first before it.  Both are found through
        # the index without decoding the picks in between, so a question's
        # thousandth answer costs what its first did.
        order = "ORDER BY ts DESC, seq DESC"
        receipt = (", (SELECT idx FROM audit_leaf l WHERE l.seq=a.seq ORDER BY idx DESC LIMIT 1),"
                   " (SELECT hash FROM audit_leaf l WHERE l.seq=a.seq ORDER BY idx DESC LIMIT 1)"
                   if self.audit_enabled else "")
        counted, latest, noted, annotated, posted = self.db.reads([
            (_ACCEPTED_COUNT, (set_dir, qid)),
            (f"SELECT record, whole, carry_note, ts, seq{receipt} FROM answer_log a WHERE {live}"
             f" AND outcome='accepted' {order} LIMIT 1", (set_dir, qid)),
            (f"SELECT record, whole, carry_note, ts, seq FROM answer_log INDEXED BY log_noted WHERE {live}"
             f" AND outcome='accepted' AND noted=1 {order} LIMIT 2", (set_dir, qid)),
            (f"SELECT record, ts, seq FROM answer_log WHERE {live} AND outcome='annotated' ORDER BY ts, seq",
             (set_dir, qid)),
            (_LATEST_POSTED, (set_dir, qid)),
        ])
        count = counted[0][0]
        row = latest[0] if latest else None
        picks: list[tuple[dict[str, Any], bool, str | None, tuple[int, int]]] = []
        if row is not None:
            picks.append((json.loads(row[0]), bool(row[1]), row[2], (row[3], row[4])))
            if not row[1] and not picks[0][0].get("note"):
                earlier = next((r for r in noted if (r[3], r[4]) < (row[3], row[4])), None)
                if earlier is not None:
                    picks.append((json.loads(earlier[0]), bool(earlier[1]), earlier[2], (earlier[3], earlier[4])))
        notes = [(json.loads(record), (ts, seq)) for record, ts, seq in annotated]
        record = self._with_approval(self._posting(posted[0] if posted else None), fold_records(qid, picks, notes, count), count)
        if record is not None and row is not None and self.audit_enabled:
            if row[5] is not None:
                record["receipt"] = {"log": self.audit_origin(), "index": int(row[5]), "leaf": row[6]}
        elif record is not None and record.get("state") == "answered" and isinstance(record.get("source"), dict):
            # A decision whose every vote was withdrawn after it: the record
            # stands on the latest vote, withdrawn since; its receipt is that vote's.
            receipt = self.receipt_of(str(record["source"].get("event_id")))
            if receipt is not None:
                record["receipt"] = receipt
        return record

    def _with_approval(self, posting: RecordedQuestion | None, base: dict[str, Any] | None,
                       count: int) -> dict[str, Any] | None:
        """``base`` as an approval's record (votes, a decision, an expiry) where
        the question's latest ``posting`` has a quorum or a deadline; else ``base`` itself."""
        if posting is None or (posting.quorum is None and posting.expires_ms is None):
            return base
        casts = self.casts(posting.event_id) if posting.quorum is not None else []
        fallback = None
        if base is None and casts:
            row = self.db.execute("SELECT record FROM answer_log WHERE event_id=? AND outcome='accepted'"
                                  " ORDER BY seq DESC LIMIT 1", (casts[-1].event_id,)).fetchone()
            fallback = json.loads(row[0]) if row and row[0] else None
        return approval_record(base, posting, casts, expired=self.is_expired(posting.event_id), count=count,
                               fallback=fallback)

    def casts(self, question_event_id: str) -> list[Cast]:
        """Every pick accepted for one posting, each with where in the room's
        order it was withdrawn (a redaction, an emptied poll vote), if it was."""
        out = []
        rows = self.db.execute(
            "SELECT event_id, sender, via, record, ts, seq, withdrawn, replaces FROM answer_log"
            " WHERE question_event_id=? AND outcome='accepted' ORDER BY ts, seq", (question_event_id,)).fetchall()
        for event_id, sender, via, record, ts, seq, withdrawn, replaces in rows:
            choice = json.loads(record).get("choice") if record else None
            gone = NEVER
            if withdrawn:
                # The earliest of what withdrew it, in the room's order, whatever
                # order they reached the bridge in: a redaction, or (a poll vote)
                # an emptied vote, kept under the person's votes in this poll.
                found = [tuple(row) for row in self.db.execute(
                    "SELECT ts, seq FROM answer_log WHERE outcome='withdrawn' AND replaces IN (?, ?)"
                    " ORDER BY ts, seq LIMIT 1", (event_id, replaces or event_id)).fetchall()]
                if via == "poll":
                    cleared = self.db.execute(
                        "SELECT MIN(ts) FROM redaction WHERE target=? AND ts>=?",
                        (votes_key(question_event_id, sender), ts)).fetchone()
                    if cleared and cleared[0] is not None:
                        found.append((cleared[0], 0))
                # None found: withdrawn by what the log no longer tells apart; one
                # before the pick itself (in the room): it never stood.
                gone = max(min(found, default=(ts, seq)), (ts, seq))
            out.append(Cast(sender, choice if isinstance(choice, str) else None, event_id, (ts, seq), gone,
                            replaces))
        return out

    def mark_expired(self, question_event_id: str, at_ms: int) -> None:
        """The posting reached its deadline (the bridge closed it, or the homeserver's own closing came)."""
        self.set_meta(f"expired:{question_event_id}", str(at_ms))

    def is_expired(self, question_event_id: str) -> bool:
        return self.get_meta(f"expired:{question_event_id}") is not None

    def receipt_of(self, event_id: str) -> dict[str, Any] | None:
        """The receipt of the newest logged outcome of ``event_id`` (what a webhook about it carries)."""
        if not self.audit_enabled:
            return None
        row = self.db.execute("SELECT MAX(seq) FROM answer_log WHERE event_id=?", (event_id,)).fetchone()
        found = self.audit.receipt(row[0]) if row and row[0] is not None else None
        return None if found is None else {"log": self.audit_origin(), "index": found[0], "leaf": found[1]}

    def audit_origin(self) -> str | None:
        """The answer log's origin (its name in checkpoints), set on the first start with the log."""
        if self._origin is None:  # kept once found: it is set once, and never changes after
            self._origin = self.get_meta("audit_origin")
        return self._origin

    def flush_view(self) -> "FlushView":
        """What a flush starts from, read at once (one round trip on PostgreSQL)."""
        dirty, held, doomed = self.db.reads([
            # Oldest first, on both backends (the flush logs outcomes and writes sets in this order).
            ("SELECT d.set_dir, d.set_id, d.qid, p.event_id, p.open, p.closed_why FROM dirty d LEFT JOIN posted p"
             " ON p.rowid = (SELECT MAX(rowid) FROM posted q WHERE q.set_dir=d.set_dir AND q.qid=d.qid)"
             " ORDER BY d.rowid", ()),
            (_HELD, ()),
            (_DOOMED, ()),
        ])
        return FlushView(
            dirty=[(row[0], row[1], row[2]) for row in dirty],
            postings={(row[0], row[2]): self._posting(row[3:]) for row in dirty if row[3] is not None},
            held=held, doomed=doomed)

    def dirty(self) -> list[tuple[str, str, str]]:
        # Oldest first, on both backends (the flush logs outcomes and writes sets in this order).
        return self.db.execute("SELECT set_dir, set_id, qid FROM dirty ORDER BY rowid").fetchall()

    def clear_dirty(self, items: Iterable[tuple[str, str, str]]) -> None:
        for set_dir, _set_id, qid in items:  # with the flush's COMMIT, on PostgreSQL
            self.db.defer("DELETE FROM dirty WHERE set_dir=? AND qid=?", (set_dir, qid))

    # -- pending notices: worked out a window at a time, so a backlog of tens
    # of thousands (a homeserver slower to take the replies than the answers)
    # costs a pass neither memory nor time in proportion to it.

    def pending_acks(self, limit: int, skip_rooms: Iterable[str] = ()) -> list[tuple[int, int]]:
        """(last seq, entries) of the oldest ``limit`` acknowledgements to send:
        one per person per question for accepted answers (the last one, which
        stands), one per entry otherwise; entries whose set is held (dirty)
        and rooms in ``skip_rooms`` (backed off) wait."""
        rooms = list(skip_rooms)
        return self.db.execute(
            "SELECT MAX(seq), COUNT(*) FROM answer_log a WHERE acked=0 AND outcome IN ('accepted','annotated','withdrawn')"
            " AND NOT EXISTS (SELECT 1 FROM dirty d WHERE d.set_dir=a.set_dir AND d.qid=a.qid)"
            + (f" AND room_id NOT IN ({','.join('?' * len(rooms))})" if rooms else "") +
            " GROUP BY room_id, sender, question_event_id, CASE WHEN outcome='accepted' THEN 0 ELSE seq END"
            " ORDER BY MIN(seq) LIMIT ?", (*rooms, limit)).fetchall()

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
        """The pending entries the notice of entry ``last`` stands for, oldest
        first: for an accepted answer or a refusal, the same person's pending
        ones of that outcome on that question up to it; otherwise itself."""
        row = self.db.execute("SELECT outcome, room_id, sender, question_event_id FROM answer_log WHERE seq=?",
                              (last,)).fetchone()
        if row is None or row[0] not in ("accepted", "refused"):
            return [last]
        outcome, room_id, sender, question = row
        same_question = "question_event_id IS NULL" if question is None else "question_event_id=?"
        rows = self.db.execute(
            f"SELECT seq FROM answer_log WHERE acked=0 AND outcome=? AND room_id=? AND sender=? AND {same_question}"
            " AND seq<=? ORDER BY seq", (outcome, room_id, sender, *(() if question is None else (question,)), last))
        return [seq for (seq,) in rows.fetchall()] or [last]

    def mark_acked(self, seq: int, state: int = 1) -> None:
        """``state``: SENT, COALESCED (told in a later reply) or DROPPED."""
        self.db.defer("UPDATE answer_log SET acked=? WHERE seq=?", (state, seq))

    def drop_notice(self, seq: int, room_id: str, reason: str, at_ms: int) -> None:
        self.mark_acked(seq, DROPPED)
        self.db.defer("INSERT OR REPLACE INTO dropped_notice(seq, room_id, reason, at) VALUES (?,?,?,?)",
                      (seq, room_id, reason, at_ms))

    def dropped_notices(self, limit: int = 50) -> list[tuple[int, str, str, int]]:
        """(seq, room, reason, when) of the latest notices given up on."""
        return self.db.execute("SELECT seq, room_id, reason, at FROM dropped_notice ORDER BY seq DESC LIMIT ?",
                               (limit,)).fetchall()

    # -- what is held back ------------------------------------------------

    def hold_set(self, set_dir: str, set_id: str, reason: str, now_ms: int, retry_ms: int | None = None) -> int:
        """Hold a set whose folder can't be written; returns the attempts so
        far.  Retries back off from 1 s to 5 minutes (every ``retry_ms`` when given)."""
        row = self.db.execute("SELECT attempts FROM held_set WHERE set_dir=?", (set_dir,)).fetchone()
        attempts = (row[0] if row else 0) + 1
        delay = retry_ms if retry_ms is not None else min(1000 * 2 ** min(attempts - 1, 9), 300_000)
        self.db.execute(
            "INSERT INTO held_set(set_dir, set_id, reason, since, attempts, next_try) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(set_dir) DO UPDATE SET reason=excluded.reason, attempts=excluded.attempts,"
            " next_try=excluded.next_try", (set_dir, set_id, reason, now_ms, attempts, now_ms + delay))
        return attempts

    def release_set(self, set_dir: str) -> bool:
        return self.db.execute("DELETE FROM held_set WHERE set_dir=?", (set_dir,)).rowcount > 0

    def held_sets(self) -> list[tuple[str, str, str, int, int, int]]:
        """(set dir, set id, reason, since, attempts, next try) of every held set."""
        return self.db.execute(_HELD).fetchall()

    def record_sent(self, event_id: str, room_id: str, *, question_event_id: str | None, about: str | None = None,
                    kind: str = "notice") -> None:
        """One of the bridge's own messages, and what it is about."""
        self.db.defer("INSERT OR IGNORE INTO sent(event_id, room_id, question_event_id, about, kind)"
                      " VALUES (?,?,?,?,?)", (event_id, room_id, question_event_id, about, kind))

    def sent_question(self, event_id: str) -> str | None:
        """The question a message the bridge sent is about (None: not the bridge's, or about none)."""
        row = self.db.execute("SELECT question_event_id FROM sent WHERE event_id=?", (event_id,)).fetchone()
        return row[0] if row else None

    def acknowledgement_of(self, event_id: str) -> str | None:
        """The bridge's latest word back on a person's event."""
        row = self.db.execute("SELECT event_id FROM sent WHERE about=? ORDER BY rowid DESC LIMIT 1",
                              (event_id,)).fetchone()
        return row[0] if row else None

_Q = "event_id, room_id, set_id, content, open, closed_why"
# Ids in one IN (...) of ``know_batch``: well within SQLite's and PostgreSQL's limits on parameters.
_IDS_PER_READ = 500
# The newest posting of a set folder's question, as ``Store._posting`` reads it.
_LATEST_POSTED = "SELECT event_id, open, closed_why FROM posted WHERE set_dir=? AND qid=? ORDER BY rowid DESC LIMIT 1"
# Held sets, ties first held first on both backends; files to delete.
_HELD = "SELECT set_dir, set_id, reason, since, attempts, next_try FROM held_set ORDER BY since, rowid"
_DOOMED = "SELECT set_dir, path FROM doomed_file"
# An edit whose original never comes is dropped after this long.
PARKED_FOR_MS = 7 * 24 * 3600 * 1000
# Posted questions kept parsed: the ones being answered now, not every one ever posted.
_RECENT_QUESTIONS = 512



def _question(row: tuple) -> RecordedQuestion:
    return RecordedQuestion(event_id=row[0], room_id=row[1], set_id=row[2], content=json.loads(row[3]),
                            open=bool(row[4]), closed_why=row[5])



class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception; ``ended`` is
    called when it ends, either way."""

    def __init__(self, db: sqlite3.Connection, flush: bool = True, ended: Callable[[], None] = lambda: None):
        self.db = db
        self.flush = flush
        self.ended = ended

    def __enter__(self) -> sqlite3.Connection:
        if not self.flush:
            self.db.execute("PRAGMA synchronous=NORMAL")
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            if not self.flush:  # no __exit__ to say it again: the next transaction's commit waits as it should
                self.db.execute("PRAGMA synchronous=FULL")
            raise
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        self.ended()
        try:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            if not self.flush:
                self.db.execute("PRAGMA synchronous=FULL")


class _Savepoint:
    """SAVEPOINT ... RELEASE, rolled back to the savepoint on any exception
    (then ``undone`` is called), a late write's failure at RELEASE too."""

    def __init__(self, db: sqlite3.Connection, undone: Callable[[], None] = lambda: None):
        self.db = db
        self.undone = undone

    def __enter__(self) -> sqlite3.Connection:
        self.db.defer("SAVEPOINT part")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.db.execute("RELEASE part")
                return
            except Exception as late:  # noqa: BLE001 - re-raised, once this part is undone
                if isinstance(late, sqlite3.OperationalError):
                    raise  # the store failed as a whole: the transaction goes
                # A write of this part sent late (PostgreSQL sends the writes
                # whose results nobody reads with the next statement that waits,
                # ``PgConnection.defer``) failed: this part is undone, as if the
                # write had failed where it was made.
                self.undone()
                self.db.execute("ROLLBACK TO part")
                self.db.execute("RELEASE part")
                raise
        self.undone()
        self.db.execute("ROLLBACK TO part")
        self.db.execute("RELEASE part")
