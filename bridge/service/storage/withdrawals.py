"""What takes back what an event put into a record: a redaction (an
original takes its edits with it, an edit goes alone) or an emptied poll
vote.  Withdrawn entries stay in the log (``withdrawn=1``); of an original
and its edits still standing only the latest counts, the others are
shadowed; the files withdrawn notes brought are doomed (deleted from the
set folder once answers.json no longer lists them)."""

from __future__ import annotations

import json


class Withdrawals:
    """A part of ``Store`` (store.py): the withdrawn and shadowed marks of
    ``answer_log``, and ``doomed_file``'s rows a withdrawal adds."""

    def withdraw(self, event_id: str) -> tuple[str, str, str] | None:
        """Withdraw what ``event_id`` put into a record (a redaction).

        An original takes its edits with it (clients hide them too); an edit
        goes alone, and the version before it (an earlier edit, or the
        original) stands again.  Files the withdrawn rows brought are doomed:
        deleted from the set folder once answers.json no longer lists them.
        Returns (set_dir, set_id, qid) of the question touched, or None when
        the event had recorded nothing (a refused answer, a stranger's event).
        """
        found = self.db.execute(
            "SELECT seq, set_dir, set_id, qid, outcome, record, whole, replaces, withdrawn, event_id FROM answer_log"
            " WHERE (event_id=? OR replaces=?) AND outcome IN ('accepted','annotated') ORDER BY seq",
            (event_id, event_id)).fetchall()
        rows = [row for row in found if not row[8]]
        if not rows:
            # Withdrawn already (by a later empty vote read first): the earlier
            # moment it stopped counting may change a quorum's tally.
            self._recount(next((row[1:4] for row in found if row[4] == "accepted" and row[9] == event_id), None))
            return None
        brought = {(set_dir, qid, path) for _seq, set_dir, _set_id, qid, outcome, record, whole, *_rest in rows
                   if outcome == "annotated" and record and set_dir and not whole
                   for path in json.loads(record).get("attachments") or ()}
        touched = self._withdraw_rows([row[:4] for row in rows])
        for set_dir, qid, path in sorted(brought):
            if not self._still_named(set_dir, qid, path):
                self.db.execute("INSERT INTO doomed_file(set_dir, path) VALUES (?, ?)"
                                " ON CONFLICT DO NOTHING", (set_dir, path))
        for root in {row[7] for row in rows if row[7]}:
            self.reshadow(root)
        return touched

    def _still_named(self, set_dir: str, qid: str, path: str) -> bool:
        """Whether an entry not withdrawn still brings ``path``: an edit that
        changed a file's caption carries the file it kept, and taking the
        edit back leaves the original, which names it, standing again."""
        rows = self.db.execute(
            "SELECT record FROM answer_log WHERE set_dir=? AND qid=? AND withdrawn=0 AND record LIKE ?"
            " AND outcome IN ('accepted','annotated')", (set_dir, qid, f"%{path}%")).fetchall()
        return any(path in (json.loads(record).get("attachments") or ()) for (record,) in rows)

    def reshadow(self, original: str) -> None:
        """Of an original and its edits still standing, only the latest in the
        room's order counts; the others are shadowed (kept, not counted)."""
        rows = self.db.execute(
            "SELECT seq FROM answer_log WHERE (event_id=? OR replaces=?) AND withdrawn=0"
            " AND outcome IN ('accepted','annotated') ORDER BY ts, seq", (original, original)).fetchall()
        for index, (seq,) in enumerate(rows):
            self.db.execute("UPDATE answer_log SET shadowed=? WHERE seq=?", (int(index < len(rows) - 1), seq))

    def withdraw_votes(self, question_event_id: str, sender: str, until_ts: int | None = None) -> tuple[str, str, str] | None:
        """An empty poll vote: withdraw every vote ``sender`` gave in the
        question's poll before it (in the room's order)."""
        until = "" if until_ts is None else " AND ts<=?"
        found = self.db.execute(
            "SELECT seq, set_dir, set_id, qid, withdrawn FROM answer_log WHERE question_event_id=? AND sender=?"
            f" AND via='poll' AND outcome='accepted'{until} ORDER BY seq",
            (question_event_id, sender) + (() if until_ts is None else (until_ts,))).fetchall()
        rows = [row[:4] for row in found if not row[4]]
        if not rows:
            # Votes a later empty vote took back already: read late, this one
            # moves the moment they stopped counting earlier, and a quorum's
            # tally (who decided, and when) is counted again.
            self._recount(found[0][1:4] if found else None)
        return self._withdraw_rows(rows)

    def _recount(self, question: tuple | None) -> None:
        """(set_dir, set_id, qid), when a withdrawal found it withdrawn already."""
        if question is not None:
            self.mark_dirty((question[0], question[1], question[2]))

    def _withdraw_rows(self, rows: list[tuple]) -> tuple[str, str, str] | None:
        if not rows:
            return None
        for seq, set_dir, set_id, qid in rows:
            self.db.execute("UPDATE answer_log SET withdrawn=1 WHERE seq=?", (seq,))
            self.mark_dirty((set_dir, set_id, qid))
        _seq, set_dir, set_id, qid = rows[-1]
        return set_dir, set_id, qid
