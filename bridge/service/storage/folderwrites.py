"""What the writes of answers.json still owe: the questions made dirty
(``dirty``: to be written), the sets held back (``held_set``: a folder that
can't be written is retried with backoff on its own while the others move
on, issue 14) and the files doomed (``doomed_file``: deleted from the set
folder once answers.json no longer lists them); and what a flush starts
from, read at once (``FlushView``).  A question is made dirty by
``Store._dirty``, with the batch's memo."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from bridge.protocol.recorded import RecordedQuestion

# Held sets, ties first held first on both backends; files to delete.
_HELD = "SELECT set_dir, set_id, reason, since, attempts, next_try FROM held_set ORDER BY since, rowid"
_DOOMED = "SELECT set_dir, path FROM doomed_file"
# At most this many questions' records read ahead with a flush's view (a batch touches a few).
_AHEAD = 50


@dataclass(frozen=True)
class FlushView:
    """The store as a flush starts: the dirty questions (set dir, set id,
    qid; oldest first), the latest posting of each by (set dir, qid), the
    held sets' rows (``held_sets``), the files to delete (``doomed_files``)
    and, by (set dir, qid), the records of the dirty questions the batch
    made dirty (``projection``), read with the rest."""

    dirty: list[tuple[str, str, str]]
    postings: dict[tuple[str, str], RecordedQuestion]
    held: list[tuple[str, str, str, int, int, int]]
    doomed: list[tuple[str, str]]
    records: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)


class FolderWrites:
    """A part of ``Store`` (store.py): ``dirty``, ``held_set`` and ``doomed_file``."""

    def flush_view(self, *, commit: bool = False) -> "FlushView":
        """What a flush starts from, read at once (one round trip on
        PostgreSQL).  Inside a batch's transaction (``commit``: its COMMIT
        goes with the reads, last), the records of the questions the batch
        made dirty come with them: a batch's flush waits once for its reads,
        not once more per question written."""
        batch = self._batch
        ahead = sorted(batch.dirtied)[:_AHEAD] if batch is not None else []
        reads = [
            # Oldest first, on both backends (the flush logs outcomes and writes sets in this order).
            ("SELECT d.set_dir, d.set_id, d.qid, p.event_id, p.open, p.closed_why FROM dirty d LEFT JOIN posted p"
             " ON p.rowid = (SELECT MAX(rowid) FROM posted q WHERE q.set_dir=d.set_dir AND q.qid=d.qid)"
             " ORDER BY d.rowid", ()),
            (_HELD, ()),
            (_DOOMED, ()),
        ]
        for set_dir, _set_id, qid in ahead:
            reads += self.projection_reads(set_dir, qid)
        rows = self.db.reads(reads, commit=commit)
        dirty, held, doomed = rows[:3]
        view = FlushView(
            dirty=[(row[0], row[1], row[2]) for row in dirty],
            postings={(row[0], row[2]): self._posting(row[3:]) for row in dirty if row[3] is not None},
            held=held, doomed=doomed)
        each = len(rows[3:]) // len(ahead) if ahead else 0
        still = set(view.dirty)
        for n, question in enumerate(ahead):
            if question in still:  # dirty as the view reads it (a batch's always are)
                set_dir, _set_id, qid = question
                view.records[(set_dir, qid)] = self.projected(set_dir, qid, rows[3 + n * each:3 + (n + 1) * each])
        return view

    def dirty(self) -> list[tuple[str, str, str]]:
        # Oldest first, on both backends (the flush logs outcomes and writes sets in this order).
        return self.db.execute("SELECT set_dir, set_id, qid FROM dirty ORDER BY rowid").fetchall()

    def clear_dirty(self, items: Iterable[tuple[str, str, str]]) -> None:
        for set_dir, _set_id, qid in items:  # with the flush's COMMIT, on PostgreSQL
            self.db.defer("DELETE FROM dirty WHERE set_dir=? AND qid=?", (set_dir, qid))

    def note_unwritten(self, set_dir: str, qid: str, why: str) -> None:
        """The answers to ``qid`` still waiting for their word back were
        written to no answers.json (its set's folder was removed): ``why``
        goes with that word back."""
        self.db.execute("UPDATE answer_log SET message=? WHERE set_dir=? AND qid=? AND acked=0 AND outcome='accepted'",
                        (why, set_dir, qid))

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

    def recorded_qids(self, set_dir: str) -> list[str]:
        """Every question of the folder the answer log holds anything for."""
        return [qid for (qid,) in self.db.execute(
            "SELECT DISTINCT qid FROM answer_log WHERE set_dir=? AND qid IS NOT NULL ORDER BY qid",
            (set_dir,)).fetchall()]

    def release_set(self, set_dir: str) -> bool:
        return self.db.execute("DELETE FROM held_set WHERE set_dir=?", (set_dir,)).rowcount > 0

    def held_sets(self) -> list[tuple[str, str, str, int, int, int]]:
        """(set dir, set id, reason, since, attempts, next try) of every held set."""
        return self.db.execute(_HELD).fetchall()

    def doomed_files(self) -> list[tuple[str, str]]:
        return self.db.execute(_DOOMED).fetchall()

    def forget_doomed(self, set_dir: str, path: str) -> None:
        self.db.defer("DELETE FROM doomed_file WHERE set_dir=? AND path=?", (set_dir, path))
