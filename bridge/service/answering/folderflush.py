"""The folder side of the pipeline: the dirty questions of the store
projected into each set's ``answers.json``, one locked write per set per
batch, and a set that can't take it held back on its own."""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from bridge.answers.document import AnswersError, mirror_records, record_problem, utc_of_ms
from bridge.answers.file import ANSWERS_NAME, AnswersFile, LockBusy
from bridge.protocol.approval_record import outcome_mark, outcome_of
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.store import FlushView, Store

log = logging.getLogger(__name__)

# How long a flush waits for a set's writer lock before holding the set back
# (and how soon it tries again): a writer paused while it holds the lock (a
# frozen former leader) must not stall every room with it.
LOCK_WAIT = 0.2
LOCK_RETRY_MS = 500
LOCK_BUSY_PROBLEM = "another process holds the set's lock (a writer paused or slow); tried again shortly"


class FolderFlush:
    """Pipeline's half that writes the folders (a mixin: it shares the
    pipeline's store, clock and hooks)."""

    store: Store
    clock: Callable[[], str] | None
    may_write: Callable[[], None] | None
    on_write: Callable[[float], None] | None
    on_set_written: Callable[[str], None] | None
    _first_flush: bool
    # Set folders seen holding their answers.json (at the start's look, or
    # written since): one without it now lost it (its agent deleted it).
    _had_answers: set[str]
    report_trouble: Callable[[str, str], None]

    def now(self) -> str:
        """When an answer is recorded (``updated``): the pipeline's clock, or the store's."""
        return self.clock() if self.clock is not None else utc_of_ms(self.store.clock.now_ms())

    def flush(self, *, commit: Callable[[], None] | None = None, idle: bool = False,
              view: FlushView | None = None) -> int:
        """Project every dirty question into its set's answers.json; returns
        how many sets were written.

        Each set stands alone: one whose folder can't be written (gone,
        read-only, full, a corrupt answers.json) is held back with its
        reason and retried with backoff, its questions staying dirty in the
        store (durable there, not yet in the folder, not acknowledged),
        while the other sets and the transport's progress move on.

        ``idle``: the batch changed nothing in the store (the bridge's own
        messages coming back, chatter), so the transport's progress is
        committed without waiting for the disk.  Losing that progress to a
        power cut only means the same nothing is received again; the WAL
        keeps commits in order, so it can never outlive an earlier one.

        ``view``: what the flush starts from, when already read (``process``
        reads it with its transaction's COMMIT)."""
        if view is None:
            view = self.store.flush_view()
        dirty = view.dirty
        # The records read with the view stand unless an approval's outcome is logged now.
        records = {} if self._log_outcome_changes(dirty, view.postings, view.records) else view.records
        by_set: dict[tuple[str, str], list[str]] = defaultdict(list)
        for set_dir, set_id, qid in dirty:
            by_set[(set_dir, set_id)].append(qid)
        now = self.now()
        now_ms = self.store.clock.now_ms()  # next_try is judged by whichever instance leads (dbclock)
        held = {row[0]: row[5] for row in view.held}
        written: list[tuple[str, str, str]] = []
        nowhere: list[tuple[str, str]] = []  # (set dir, qid) "written" to a folder that is gone
        holds: dict[tuple[str, str], str] = {}
        for (set_dir, set_id), qids in by_set.items():
            if held.get(set_dir, 0) > now_ms and not self._first_flush:
                continue  # held back, and not due for another try yet (a start tries them all)
            problem = self._write_set(set_dir, set_id, qids, now, records, held=set_dir in held)
            if problem == FOLDER_GONE and not os.path.lexists(set_dir) \
                    and set_dir not in self.store.folders_with_open():
                # The set was removed, and its questions closed as such: there
                # is nowhere to write and nothing to hold; the answers stay in
                # the store.  A folder put back there is a new set.  (Gone but
                # not closed yet, a folder moved away and back, say: held and
                # tried again, as before.)
                log.info("set folder %s is gone; its answers stay in the store only", set_dir)
                written.extend((set_dir, set_id, qid) for qid in qids)
                nowhere.extend((set_dir, qid) for qid in qids)
            elif problem is None:
                written.extend((set_dir, set_id, qid) for qid in qids)
            else:
                holds[(set_dir, set_id)] = problem
        if written or holds or commit:  # (nothing to end with: the batch's own COMMIT was the end)
            self._end_flush(written, holds, held, now_ms, commit, flush=not (idle and not dirty), nowhere=nowhere)
        self._first_flush = False
        for _problem in holds.values():
            self.report_trouble("set", "unwritable")
        if view.doomed:  # the usual case, after every batch: none
            self._delete_withdrawn_files(view.doomed, {d for d, _s, _q in set(dirty) - set(written)})
        return len({d for d, _s, _q in written})

    def _end_flush(self, written: list[tuple[str, str, str]], holds: dict[tuple[str, str], str],
                   held: dict[str, int], now_ms: int, commit: Callable[[], None] | None, *, flush: bool,
                   nowhere: list[tuple[str, str]] = ()) -> None:
        """The flush's final transaction: the questions written are clean,
        the sets held back are noted, and the transport's ``commit``.
        ``nowhere``: questions of a removed set, whose answers waiting for
        their word back were written to no folder: the word back says so."""
        with self.store.transaction(flush=flush):
            for set_dir, qid in nowhere:
                self.store.note_unwritten(set_dir, qid, NOT_WRITTEN)
            self.store.clear_dirty(written)
            for set_dir in {d for d, _s, _q in written} & held.keys():
                self.store.release_set(set_dir)
                log.info("answers.json of %s written again; the set is no longer held back", set_dir)
            for (set_dir, set_id), problem in holds.items():
                busy = problem == LOCK_BUSY_PROBLEM  # another writer's turn: no backing off
                attempts = self.store.hold_set(set_dir, set_id, problem, now_ms,
                                               retry_ms=LOCK_RETRY_MS if busy else None)
                (log.warning if attempts == 1 else log.info)(
                    "set %s held back (try %d): %s; its answers are kept in the store and retried", set_dir,
                    attempts, problem)
            if commit:
                commit()

    def _log_outcome_changes(self, dirty: list[tuple[str, str, str]],
                             postings: dict[tuple[str, str], RecordedQuestion],
                             records: dict[tuple[str, str], dict[str, Any] | None]) -> bool:
        """Before any record is written: an approval whose outcome changed
        (to decided, or to expired) gets its leaf in the answer log (True
        when one did).  ``records``: those already read, by (set dir, qid).

        This is the one place, whatever changed it: a vote, a redaction or
        an edit read late (an earlier event in the room's order can undo a
        decision after the deadline, or decide a question already closed as
        expired), or the deadlines pass marking the deadline reached.  Every
        such change leaves its question dirty until written, so a crash
        before the write comes back here at the next start."""
        changes = []
        revisit = []  # closed approvals whose record changed: the pass tells the room what it is now, if new
        for set_dir, _set_id, qid in dirty:
            posting = postings.get((set_dir, qid))
            if posting is None or (posting.quorum is None and posting.expires_ms is None):
                continue
            if not posting.open:
                revisit.append(posting.event_id)
            known = (set_dir, qid) in records
            record = records[(set_dir, qid)] if known else self.store.projection(set_dir, qid)
            outcome = outcome_of(record)
            if outcome is not None and \
                    self.store.approval_outcome_logged(posting.event_id) != outcome_mark(outcome, record):
                changes.append((posting, outcome, record))
        if changes or revisit:
            with self.store.transaction(flush=False):  # made durable by the flushed commit after the writes
                for posting, outcome, record in changes:
                    self.store.log_approval_outcome(posting.event_id, outcome, record)
                if revisit:
                    # Closed already: the deadlines pass tells the room what it is now
                    # (an outcome of its own, or an answer given in time standing).
                    # (Imported here: the first sync does not need the room's deadline code.)
                    from bridge.service.answering.deadlines import TRACKED

                    for event_id in revisit:
                        self.store.set_meta(TRACKED + event_id, "1")
        return bool(changes)

    def rewrite_missing(self) -> int:
        """Every set folder that is there without the answers.json its
        answers belong in (deleted while the bridge was down, say) is written
        again whole, now; how many.  Asked at a start, before the first
        batch: nothing else would write it before the set's next answer, and
        that answer's write must know the folder had one."""
        missing = []
        for set_dir, set_id in self.store.set_folders():
            if os.path.lexists(os.path.join(set_dir, ANSWERS_NAME)):
                self._had_answers.add(set_dir)
            elif os.path.isdir(set_dir):
                missing.append((set_dir, set_id))
        marked = False
        with self.store.transaction(flush=False):  # made durable by the flush's own commit
            for set_dir, set_id in missing:
                for qid in self.store.recorded_qids(set_dir):
                    self.store.mark_dirty((set_dir, set_id, qid))
                    marked = True
        return self.flush() if marked else 0

    def retry_held(self) -> bool:
        """Write the held sets that are due; True when some are still held."""
        rows = self.store.held_sets()
        if rows and min(row[5] for row in rows) <= self.store.clock.now_ms():
            self.flush()
        return bool(self.store.held_sets())

    def _write_set(self, set_dir: str, set_id: str, qids: list[str], now: str,
                   known: dict[tuple[str, str], dict[str, Any] | None], held: bool = False) -> str | None:
        """Write one set's dirty records (those in ``known`` as read there);
        the reason when the folder can't take them.  ``held``: the set was
        held back (its folder could not be written)."""
        if os.path.islink(set_dir):
            return "the set folder is now a symlink; the bridge does not write through it"
        if (held or set_dir in self._had_answers) and not os.path.lexists(os.path.join(set_dir, ANSWERS_NAME)):
            # Moved aside by an operator mending a corrupt one, as the docs
            # say, or deleted by its agent: written anew whole, not with the
            # dirty records alone, which lost every answer accepted before.
            # (A set's first answers.json needs no look: nothing came before.)
            qids = list(dict.fromkeys([*qids, *self.store.recorded_qids(set_dir)]))
        records = {qid: known[(set_dir, qid)] if (set_dir, qid) in known else self.store.projection(set_dir, qid)
                   for qid in qids}
        for attempt in range(2):
            started = time.monotonic()
            try:
                AnswersFile(set_dir, set_id).update(
                    lambda doc, now, records=records: _respecting_others(self._fenced(doc), records, now, set_dir),
                    now, lock_wait=LOCK_WAIT)
            except LockBusy as exc:
                return _folder_problem(exc)  # nothing wrong with the records: held, and tried again soon
            except (AnswersError, OSError, ValueError, TypeError, RecursionError) as exc:
                if attempt == 0 and self._set_aside_unwritable(set_dir, qids, records):
                    continue  # a record no write could take was set aside; the rest is tried again
                return _folder_problem(exc)
            self._had_answers.add(set_dir)
            if self.on_write:
                self.on_write(time.monotonic() - started)
            if self.on_set_written:
                self.on_set_written(set_dir)
            return None
        return None

    def _fenced(self, doc: Any) -> Any:
        if self.may_write is not None:
            self.may_write()
        return doc

    def _set_aside_unwritable(self, set_dir: str, qids: list[str], records: dict[str, Any]) -> bool:
        """After a failed write: set aside every logged entry that makes a
        record no write could take (stored before the checks at the door
        existed, say), so the set is written without them.  True when any was."""
        changed = False
        with self.store.transaction():
            for qid in qids:
                for _ in range(50):
                    record = records[qid]
                    problem = record_problem(qid, record) if record is not None else None
                    seq = self.store.latest_recording(set_dir, qid) if problem else None
                    if seq is None:
                        break
                    log.warning("logged answer %d for %s can't be written (%s); set aside as unstorable",
                                seq, qid, problem)
                    self.store.set_aside_entry(seq, "unstorable", "the answer holds a value that can't be "
                                                                  "recorded.")
                    self.report_trouble("event", "unstorable")
                    records[qid] = self.store.projection(set_dir, qid)
                    changed = True
        return changed

    def _delete_withdrawn_files(self, doomed: list[tuple[str, str]], held: set[str]) -> None:
        """Files whose annotation was withdrawn, deleted now that answers.json
        no longer lists them (a pasted secret must be removable); not yet
        where a set is ``held`` (its answers.json still lists them)."""
        for set_dir, path in doomed:
            if set_dir in held:
                continue  # answers.json there still lists it: deleted once the set is written
            if path.startswith("attachments/") and ".." not in path.split("/"):
                try:
                    (Path(set_dir) / path).unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("withdrawn file %s in %s not deleted: %s", path, set_dir, exc)
                    continue
            with self.store.transaction(flush=False):  # a lost mark only deletes nothing again
                self.store.forget_doomed(set_dir, path)


def _respecting_others(doc: dict[str, Any], records: dict[str, Any], now: str, set_dir: str) -> dict[str, Any]:
    """The bridge's records written, except where another writer's is newer (kept, and said)."""
    written, kept = mirror_records(doc, records, now)
    for line in kept:
        log.warning("%s: %s", set_dir, line)
    return written


FOLDER_GONE = "the set folder is gone"
# The word back on an answer accepted as its set's folder was removed (before its questions were closed).
NOT_WRITTEN = "But its set was removed before it could be written there: the agent that asked does not get it."


def _folder_problem(exc: BaseException) -> str:
    """What an operator needs to hear about a set folder that can't be written."""
    if isinstance(exc, LockBusy):
        return LOCK_BUSY_PROBLEM
    if isinstance(exc, AnswersError):
        return f"answers.json can't be read: {exc.message}"
    if isinstance(exc, FileNotFoundError):
        return FOLDER_GONE
    if isinstance(exc, OSError):
        return f"the set folder can't be written: {exc.strerror or exc}"
    return f"answers.json can't be written: {exc}"
