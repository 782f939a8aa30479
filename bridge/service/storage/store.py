"""The bridge's store (SQLite, or PostgreSQL through ``pgdialect``): what it posted, what it has seen, and why.

The answer log is the source of truth; ``answers.json`` is a projection of
it.  Every batch is committed here before the folder is written, so a crash
between the two is repaired on start by re-projecting the pending questions.

``Store`` is the one face callers use.  This module holds what its parts
share: the connection and its own thread, migration (the schema is
``schema``), transactions and savepoints, and what a batch knows
(``know_batch``), which the parts' reads answer from and their writes keep
up to date.  The tables are the parts', one module per family of what is
stored: ``postings``, ``answerlog``, ``withdrawals``, ``redactions`` (and
edits), ``leaves`` (the verifiable log), ``projection`` (a question's
record), ``notices`` (the word back), ``folderwrites`` (dirty questions,
held sets, doomed files), ``handled``, ``attachments``, ``operators``,
``undecrypted`` and ``meta``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, TypeVar

from bridge.protocol.fit import fit_id
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.answerlog import SET_ASIDE_REASONS, AnswerLog, LogEntry
from bridge.service.storage.attachments import Attachments
from bridge.service.storage.dbclock import DatabaseClock, LocalClock
from bridge.service.storage.dialect import SQLITE, Dialect
from bridge.service.storage.folderwrites import FlushView, FolderWrites
from bridge.service.storage.guesses import MOST, condition, taken
from bridge.service.storage.handled import Handled
from bridge.service.storage.leaves import Leaves
from bridge.service.storage.meta import Meta
from bridge.service.storage.notices import COALESCED, DROPPED, PENDING, SENT, Notices
from bridge.service.storage.operators import Operators, PostedQuestion
from bridge.service.storage.postings import PostingConflict, Postings
from bridge.service.storage.projection import Projection
from bridge.service.storage.redactions import PARKED_FOR_MS, RedactionsAndEdits, votes_key, votes_keys
from bridge.service.storage.schema import SCHEMA_VERSION, migration
from bridge.service.storage.storethread import StoreThread
from bridge.service.storage.undecrypted import Undecrypted
from bridge.service.storage.withdrawals import Withdrawals

T = TypeVar("T")

# The store's face: ``Store``, and the names its callers import from here
# (the parts' own modules are where they are defined).
__all__ = ["Store", "StoreVersionError", "MigrationBusy", "SCHEMA_VERSION", "LogEntry", "SET_ASIDE_REASONS",
           "PostingConflict", "PostedQuestion", "PARKED_FOR_MS", "votes_key", "PENDING", "SENT", "COALESCED", "DROPPED",
           "FlushView"]


log = logging.getLogger(__name__)


class StoreVersionError(Exception):
    pass


class MigrationBusy(Exception):
    """Another session held the store's migration lock for longer than a
    start waits (PostgreSQL's: ``migratelock``)."""


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
    # The delivery (an appservice transaction's key) the batch came in, and whether it was taken before.
    delivery: str | None = None
    delivered: bool = False
    counts: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    # The question (set dir, qid) of each posting found, by its event id.
    questions: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    # Empty votes (``votes_key`` -> (floor, [(ts, event id)])): every one at
    # or after the floor (None: every one) of the batch's voters' polls.
    votes: dict[str, tuple[int | None, list[tuple[int, str]]]] = dataclasses.field(default_factory=dict)


def _clock_of(db: Any) -> "DatabaseClock | LocalClock":
    """The clock of every time another instance reads (dbclock): PostgreSQL's, or this machine's."""
    return getattr(db, "clock", None) or LocalClock()


class Store(Meta, Handled, Postings, AnswerLog, Withdrawals, RedactionsAndEdits, Leaves, Projection, Notices,
            FolderWrites, Attachments, Operators, Undecrypted):
    """The store: its parts (one module each) read and write the tables
    through ``self.db``, and keep ``know_batch``'s memo through ``_batch``,
    ``_known``, ``_dirty`` and ``_postings_changed``."""

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
        self._carried: _Batch | None = None  # what the batches kept knew, for later ones' guesses (``guesses``)
        self._learning: list[Callable[[_Batch], None]] = []  # what this transaction wrote of postings, for them
        # Every outcome appends a leaf to the answer log unless ``audit.enabled`` is off.
        self.audit_enabled = True
        self._migrate()

    def _own_connection(self) -> None:
        """``self.db`` used by one thread at a time, and the store's own thread for jobs (``storethread``)."""
        self._thread = StoreThread()
        self.clock = _clock_of(self.db)
        refresh = getattr(self.clock, "refresh", None)
        if refresh is not None:  # PostgreSQL's clock, measured again on the store's thread (a job of its own)
            self.clock.refresh = lambda: self._thread.soon(refresh)  # type: ignore[union-attr]
        self.db = self._thread.gated(self.db)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (store work, done synchronously) on the
        store's own thread, awaited: the event loop serves everything else
        meanwhile.  Each job is one piece, as a synchronous stretch on the
        loop is (``storethread``)."""
        return await self._thread.run(fn, *args, **kwargs)

    async def run_written(self, fn: Callable[..., T], /, *args: Any, flush: bool = True) -> T:
        """``fn(*args)`` in one transaction, as a job on the store's thread."""
        def job() -> T:
            with self.transaction(flush=flush):
                return fn(*args)
        return await self.run(job)

    def close(self) -> None:
        self._thread.close()
        self.db.close()

    @classmethod
    def read_only(cls, path: str | Path, *, url: str | None = None, password: str | None = None) -> "Store":
        """A store opened for reading only (``status`` while the bridge runs):
        never created, never migrated.  A store from a newer version is
        refused like on start; FileNotFoundError when there is none (no
        file, or a database the bridge has not made its tables in yet)."""
        path = Path(path)
        store = cls.__new__(cls)
        store._recent_questions = OrderedDict()
        store._origin = None
        store._kept_batch = None
        store._carried = None
        store._learning = []
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
        try:
            if store._version() == 0:
                # A database made for the bridge that it has not run on yet
                # (PostgreSQL's, created empty as docs/operators.md says): no store yet.
                raise FileNotFoundError(f"{path}: no store there yet")
        except (StoreVersionError, FileNotFoundError):
            store.db.close()
            raise
        return store

    def _migrate(self) -> None:
        if self._version() == SCHEMA_VERSION:
            return
        migrating = getattr(self.db, "migrating", contextlib.nullcontext)  # PostgreSQL's lock and limits
        with migrating():
            version = self._version()  # another instance may have migrated it
            if 0 < version < SCHEMA_VERSION:
                self._alone_on_it(version)
            for number in range(version, SCHEMA_VERSION):
                with self.transaction():
                    for statement in migration(number, self.sql):
                        self.db.execute(statement)
                    self.db.execute(f"PRAGMA user_version={number + 1}")

    def _alone_on_it(self, version: int) -> None:
        """Before migrating a store instances share (PostgreSQL's): one of
        the version before, still running, would carry on writing into a
        schema it does not know (answers without the log's leaves, say),
        so the migration waits for its heartbeats to stop, and refuses
        while they go on.  One killed is not heard from after
        ``SEEN_SECONDS``."""
        heard = getattr(self.db, "instances_heard", None)
        if heard is None:
            return
        from bridge.service.storage.leader import SEEN_SECONDS, of_this_process

        give_up = time.monotonic() + SEEN_SECONDS + 2
        # (This process's own lease, started before a term opens the store, is no other instance.)
        while running := [row for row in heard(SEEN_SECONDS) if not of_this_process(row[0])]:
            if time.monotonic() >= give_up:
                name, ago = running[0]
                raise StoreVersionError(
                    f"{self.path}: instance {name} runs on this store (heard from {ago:.0f} s ago), on store "
                    f"schema {version}; stop every instance before this version migrates it to schema "
                    f"{SCHEMA_VERSION}")
            log.warning("store schema %d: waiting for %d instance(s) of the version before to stop (%s) "
                        "before migrating it to schema %d", version, len(running), running[0][0], SCHEMA_VERSION)
            time.sleep(1)

    def _version(self) -> int:
        """The store's schema version; a store from a newer bridge is refused."""
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreVersionError(
                f"{self.path} was written by a newer askwright-bridge (store schema {version}, "
                f"this version knows {SCHEMA_VERSION}); upgrade the bridge or restore a backup"
            )
        return version

    def transaction(self, *, flush: bool = True) -> "_Transaction":
        """BEGIN IMMEDIATE ... COMMIT.  ``flush=False`` commits without waiting
        for the disk: for a transaction that a later, flushed one in the same
        batch always follows before anything relies on it (the WAL is one
        append-only file, so that fsync makes both durable; a power cut in
        between loses both, and the transport delivers the batch again)."""
        return _Transaction(self.db, flush=flush, ended=self._end_batch)

    def changes(self) -> int:
        """Rows changed through this connection so far (to tell whether a batch changed anything)."""
        return self.db.total_changes

    def unchanged_since(self, before: int) -> bool:
        """No row changed since ``changes()`` was ``before``, and no write
        waits to be sent (PostgreSQL's deferred ones count when they are)."""
        return self.db.total_changes == before and not getattr(self.db, "writes_waiting", 0)

    def savepoint(self, *, apart: bool = True) -> "_Savepoint | _Together":
        """Inside a transaction: a part of it (one event's), undone alone
        when it raises.  ``apart=False``: no savepoint, two statements a part
        fewer; the parts share round trips on PostgreSQL, so a write that
        fails may belong to any of them, and a part that raises can't be
        undone alone: ``PartsFailedTogether`` (the transaction goes: its
        owner handles it again with parts apart, where the failure finds its
        part)."""
        if apart:
            return _Savepoint(self.db, undone=self._forget_batch)
        return _Together(self.db, undone=self._forget_batch)

    # -- a batch's events, looked up at once --------------------------------

    def know_batch(self, event_ids: Iterable[str], *, elicitations: Iterable[str] = (),
                   targets: Iterable[str] = (), votes: Mapping[tuple[str, str], int] | None = None,
                   delivery: str | None = None, guess: bool = False) -> None:
        """Inside a transaction, before its events are handled: whether each
        was processed, the redactions that came before it and whether edits
        wait for it, the postings they may be looked up by (``elicitations``
        and related events, ``targets``: see ``normalize.posting_keys``), the
        empty votes of the voters in each poll voted in (``votes``: (poll,
        sender) -> earliest ts, ``normalize.poll_votes``) and whether the
        delivery they came in was taken before (``delivery``, an appservice
        transaction's key: ``txn_seen``), read at once (one round trip on
        PostgreSQL, not several per event).  Kept up to date by this
        store's writes until the transaction ends; any part undone forgets it
        (the reads go to the database again).  ``guess``: on PostgreSQL, what
        the last batch kept knew is taken instead of read when it is enough,
        checked on the server with the writes (``guesses``; ``GuessedWrong``)."""
        # Ids the store can't key by are skipped by the batch itself (``fit_id``), unread.
        ids, asked, related = (sorted({i for i in values if fit_id(i)})
                               for values in (event_ids, elicitations, targets))
        votes = {pair: ts for pair, ts in (votes or {}).items() if fit_id(pair[0]) and fit_id(pair[1])}
        if guess and self._guesses and self._guessed(ids, asked, related, votes, delivery):
            return
        reads = []
        for start in range(0, len(ids), _IDS_PER_READ):
            part = ids[start:start + _IDS_PER_READ]
            marks = ",".join("?" * len(part))
            reads += [(f"SELECT event_id FROM processed WHERE event_id IN ({marks})", part),
                      (f"SELECT target, sender FROM redaction WHERE target IN ({marks})", part),
                      (f"SELECT DISTINCT target FROM parked_edit WHERE target IN ({marks})", part)]
        looked_up = len(reads)
        parts = [(asked[start:start + _IDS_PER_READ], related[start:start + _IDS_PER_READ])
                 for start in range(0, max(len(asked), len(related)), _IDS_PER_READ)]
        for part in parts:
            reads += self.postings_reads(*part)
        pairs = sorted(votes)
        voted = [pairs[start:start + _IDS_PER_READ // 2] for start in range(0, len(pairs), _IDS_PER_READ // 2)]
        for part in voted:
            reads += self.votes_reads(part)
        if delivery is not None:
            reads.append(self.txn_read(delivery))
        rows = self.db.reads(reads) if reads else []
        known = _Batch(threading.get_ident(), set(ids), set(), {}, set(), delivery=delivery)
        if delivery is not None:
            known.delivered = bool(rows.pop())
        voted_rows = rows[len(rows) - len(voted):]
        del rows[len(rows) - len(voted):]
        for processed, redactions, parked in zip(rows[0:looked_up:3], rows[1:looked_up:3], rows[2:looked_up:3]):
            known.processed.update(row[0] for row in processed)
            known.parked.update(row[0] for row in parked)
            for target, sender in redactions:
                known.redacted_by.setdefault(target, []).append(sender)
        each = (len(rows) - looked_up) // len(parts) if parts else 0
        for n, part in enumerate(parts):
            start = looked_up + n * each
            self.know_postings(known, rows[start:start + each], *part)
        for part, found in zip(voted, voted_rows):  # after the postings: a vote's key is its poll's posting's
            self.know_votes(known, found, part)
        self._kept_batch = known

    def _guessed(self, ids: list[str], asked: list[str], related: list[str], votes: dict[tuple[str, str], int],
                 delivery: str | None) -> bool:
        keys = self.looked_up(asked, related)
        known = taken(self._carried, keys) if len(ids) + len(keys) + len(votes) <= MOST else None
        if known is None:
            return False
        postings, questions, counts = known
        # No empty vote since each vote: the posting of each poll voted in is known now.
        empty_votes = {key: (votes[pair], []) for pair, key in votes_keys(postings, votes).items()}
        self.db.expect(*condition(ids, keys, postings, questions, counts, empty_votes, delivery))
        self._kept_batch = _Batch(threading.get_ident(), set(ids), set(), {}, set(), postings=postings,
                                  delivery=delivery, counts=counts, questions=questions, votes=empty_votes)
        return True

    def _forget_batch(self) -> None:
        """A part undone: what it read or wrote is not known any more (which of it was undone, unknown)."""
        self._kept_batch = None
        self._learning = []

    def _end_batch(self, kept: bool) -> None:
        """A transaction ends: a batch's memo, when the batch is kept, joins
        what later batches may guess from (checked on the server then), and
        so does what it wrote of the postings (``_postings_changed``)."""
        batch = self._batch
        if kept and batch is not None and self._guesses:
            self._carried = _carried_on(self._carried, batch)
        learning, self._learning = self._learning, []
        if kept and learning:
            if self._carried is None or len(self._carried.postings) > _CARRIED_MOST:  # the newest postings, not all
                self._carried = _Batch(threading.get_ident(), set(), set(), {}, set())
            for learned in learning:
                learned(self._carried)
        self._kept_batch = None

    @property
    def sql(self) -> Dialect:
        """What this store's SQL says its own way (``dialect``)."""
        return getattr(self.db, "dialect", SQLITE)

    @property
    def _guesses(self) -> bool:
        """Whether batches take their look-ups from the batches before
        (``guesses``): on PostgreSQL, where a read costs a round trip."""
        return getattr(self.db, "guesses", False)

    @property
    def _batch(self) -> "_Batch | None":
        """What ``know_batch`` keeps, to the thread whose transaction it belongs
        to only: any other thread's statements wait for that transaction to
        end (the store's thread gate), and so do its reads of what it keeps."""
        batch = self._kept_batch
        return batch if batch is not None and batch.thread == threading.get_ident() else None

    def mark_dirty(self, question: tuple[str, str, str]) -> None:
        """(set dir, set id, qid) to be written to its answers.json (once a batch is enough)."""
        if self._batch is not None:
            if question in self._batch.dirtied:
                return
            self._batch.dirtied.add(question)
        self.db.defer("INSERT INTO dirty(set_dir, set_id, qid) VALUES (?,?,?) ON CONFLICT DO NOTHING", question)

    def _postings_changed(self, learned: Callable[[_Batch], None] | None = None) -> None:
        """A posting was recorded or changed: what this transaction's batch
        looked up of the postings is read again.  What later batches take
        (``guesses``) is dropped, or, with ``learned`` (what this store wrote
        of it), brought up to date that way once the transaction is kept."""
        if learned is None:
            self._carried = None
        elif self._guesses:
            self._learning.append(learned)
        if self._batch is not None:
            self._batch.postings.clear()

    def _known(self, event_id: str) -> "_Batch | None":
        batch = self._batch
        return batch if batch is not None and event_id in batch.ids else None


# Ids in one IN (...) of ``know_batch``: well within SQLite's and PostgreSQL's limits on parameters.
_IDS_PER_READ = 500
# Postings carried from batch to batch (``_carried_on``): the ones being answered now, not every one.
_CARRIED_MOST = 2000


def _carried_on(before: _Batch | None, batch: _Batch) -> _Batch:
    """What later batches may take (``guesses``): the postings, questions
    and counts ``batch`` knew over those known before it.  Merged, not
    replaced: a batch of acknowledgements between two answers knows no
    posting, and the next answer's would be read again.  Nothing in it is
    trusted: each batch checks on the server what it takes."""
    if before is None or len(before.postings) > _CARRIED_MOST:
        return batch
    before.postings.update(batch.postings)
    before.questions.update(batch.questions)
    before.counts.update(batch.counts)
    return before


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception; ``ended`` is
    called when it ends, either way."""

    def __init__(self, db: sqlite3.Connection, flush: bool = True, ended: Callable[[bool], None] = lambda kept: None):
        self.db = db
        self.flush = flush
        self.ended = ended  # called with whether the transaction is kept (committed)

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
        self.ended(exc_type is None)
        try:
            if exc_type is not None:
                self._roll_back()
            elif self.db.in_transaction:  # not committed with its last reads (``flush_view(commit=True)``)
                self.db.execute("COMMIT")
        finally:
            if not self.flush:
                self.db.execute("PRAGMA synchronous=FULL")

    def _roll_back(self) -> None:
        """What failed is what the caller hears: a COMMIT that failed for a
        full disk was rolled back by SQLite already, and the ROLLBACK's "no
        transaction is active" took its place in every log line."""
        if not self.db.in_transaction:
            return
        try:
            self.db.execute("ROLLBACK")
        except sqlite3.Error as exc:
            log.warning("rolling back after a failure failed too (%s)", exc)


class PartsFailedTogether(sqlite3.OperationalError):
    """A part of a transaction whose parts were not apart failed (a write
    sent with others' in one round trip, or the part's own handling), so it
    can't be undone alone: the transaction goes, and its owner handles it
    again with its parts apart (``Store.savepoint(apart=True)``), where the
    failure finds its part."""


class GuessedWrong(sqlite3.OperationalError):
    """What a batch took from the batch before instead of reading it no longer
    held on the server (``guesses``): nothing of the transaction was kept,
    and its owner handles the batch again, reading first."""


class _Together:
    """A part with no savepoint (``Store.savepoint(apart=False)``): raising,
    it raises ``PartsFailedTogether`` (then ``undone`` is called) unless the
    store failed as a whole or the disk did (the batch is tried again)."""

    def __init__(self, db: sqlite3.Connection, undone: Callable[[], None]):
        self.db = db
        self.undone = undone

    def __enter__(self) -> sqlite3.Connection:
        together = getattr(self.db, "parts_together", None)  # PostgreSQL's: its failures name no part
        if together is not None:
            together()
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            return
        self.undone()
        if not issubclass(exc_type, (sqlite3.OperationalError, OSError)):
            raise PartsFailedTogether(f"a part of a batch failed: {exc_type.__name__}: {exc}") from exc


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
        if exc_type is not None and issubclass(exc_type, sqlite3.OperationalError):
            self.undone()  # the store failed as a whole (or parts together): the whole transaction goes
            return
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
