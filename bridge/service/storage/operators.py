"""What operators read and do (issue 10): status counts over the postings,
the open postings reminders nudge and when each was last nudged
(``reminders``), management commands handled (``admin_command``, so a
replayed batch does not run one twice)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class PostedQuestion:
    """An open posted question, as reminders need it."""

    event_id: str
    room_id: str
    set_id: str
    set_dir: str
    qid: str
    rev: int
    title: str
    posted_at: int  # ms since the epoch


class Operators:
    """A part of ``Store`` (store.py): the status reads over ``posted`` and
    ``answer_log``, ``reminders`` and ``admin_command``."""

    def posted_revs_of(self, set_dir: str) -> dict[str, int]:
        """Question id -> the highest rev posted of it, for one set folder (resolved)."""
        return {qid: rev for qid, rev in self.db.execute(
            "SELECT qid, MAX(rev) FROM posted WHERE set_dir=? GROUP BY qid", (set_dir,))}

    def highest_posted_revs(self) -> dict[str, dict[str, int]]:
        """set folder -> question id -> the highest rev posted of it: a rev in
        questions.json below it went back (a lint warning, in lint and status)."""
        found: dict[str, dict[str, int]] = {}
        for set_dir, qid, rev in self.db.execute("SELECT set_dir, qid, MAX(rev) FROM posted GROUP BY set_dir, qid"):
            found.setdefault(set_dir, {})[qid] = rev
        return found

    def posted_question_counts(self) -> dict[str, int]:
        """set folder -> how many distinct questions of it were ever posted."""
        return dict(self.db.execute("SELECT set_dir, COUNT(DISTINCT qid) FROM posted GROUP BY set_dir").fetchall())

    def open_posted(self, set_id: str | None = None) -> list[PostedQuestion]:
        where, params = ("AND set_id=?", (set_id,)) if set_id is not None else ("", ())
        rows = self.db.execute(
            f"SELECT event_id, room_id, set_id, set_dir, qid, rev, content, posted_at FROM posted WHERE open=1 {where}"
            " ORDER BY posted_at, rowid", params).fetchall()  # ties: in posting order, on both backends
        found = []
        for event_id, room_id, set_id_, set_dir, qid, rev, content, posted_at in rows:
            title = json.loads(content).get("question", {}).get("title") or qid
            found.append(PostedQuestion(event_id, room_id, set_id_, set_dir, qid, rev, str(title), posted_at))
        return found

    def answered_question_events(self) -> set[str]:
        """Question event ids with an accepted answer that still stands (an
        ``unsure`` pick included: the person did reply; a note alone is not)."""
        rows = self.db.execute("SELECT DISTINCT question_event_id FROM answer_log WHERE outcome='accepted'"
                               " AND withdrawn=0 AND question_event_id IS NOT NULL").fetchall()
        return {row[0] for row in rows}

    def reminded(self) -> dict[str, int]:
        """question event id -> when it was last nudged (ms)."""
        return dict(self.db.execute("SELECT event_id, last_at FROM reminders").fetchall())

    def mark_reminded(self, event_id: str, at_ms: int) -> None:
        self.db.execute("INSERT INTO reminders(event_id, last_at) VALUES (?, ?)"
                        " ON CONFLICT(event_id) DO UPDATE SET last_at=excluded.last_at", (event_id, at_ms))

    def command_handled(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM admin_command WHERE event_id=?", (event_id,)).fetchone() is not None

    def mark_command(self, event_id: str, at_ms: int) -> None:
        self.db.execute("INSERT INTO admin_command(event_id, handled_at) VALUES (?, ?)"
                        " ON CONFLICT DO NOTHING", (event_id, at_ms))
