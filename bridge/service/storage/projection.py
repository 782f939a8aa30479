"""A question's record, as answers.json holds it: projected from the answer
log in the room's order (``annotate.fold_records``), and for a posting with
a quorum or a deadline turned into an approval's record from its casts."""

from __future__ import annotations

import json
from typing import Any

from bridge.protocol.annotate import fold_records
from bridge.protocol.approval_record import approval_record, of_revision
from bridge.protocol.quorum import NEVER, Cast, standing
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.answerlog import _ACCEPTED_COUNT
from bridge.service.storage.postings import _LATEST_POSTED
from bridge.service.storage.redactions import votes_key


class Projection:
    """A part of ``Store`` (store.py): reads of ``answer_log``, ``posted``
    and ``redaction`` that make a record; nothing written."""

    def projection(self, set_dir: str, qid: str) -> dict[str, Any] | None:
        """The record answers.json should hold for a question, from the log in
        the room's order (see ``annotate.fold_records``); its ``rev`` the
        number of answers ever accepted for the question (a note is not an
        answer, so a note-only record is rev 1).

        Its reads go out together (one round trip on PostgreSQL): a written
        answer costs one, not one per read."""
        return self.projected(set_dir, qid, self.db.reads(self.projection_reads(set_dir, qid)))

    def projection_reads(self, set_dir: str, qid: str) -> list[tuple[str, tuple[str, str]]]:
        """The reads a question's record is made from (``projected``), to be
        sent with others (a flush's own, ``flush_view``)."""
        live = "set_dir=? AND qid=? AND withdrawn=0 AND shadowed=0 AND record IS NOT NULL"
        # The standing pick is the latest in the room; when it has no note of
        # its own, its sender's latest earlier pick with one (or from before
        # the notes were kept apart) is the one whose note it keeps: of the
        # two latest noted picks of that person, the first before it.  (Never
        # another person's: their note is not this answer's.)  Both are found through
        # the index without decoding the picks in between, so a question's
        # thousandth answer costs what its first did.
        order = "ORDER BY ts DESC, seq DESC"
        receipt = (", (SELECT idx FROM audit_leaf l WHERE l.seq=a.seq ORDER BY idx DESC LIMIT 1),"
                   " (SELECT hash FROM audit_leaf l WHERE l.seq=a.seq ORDER BY idx DESC LIMIT 1)"
                   if self.audit_enabled else "")
        return [
            (_ACCEPTED_COUNT, (set_dir, qid)),
            (f"SELECT record, whole, carry_note, ts, seq{receipt} FROM answer_log a WHERE {live}"
             f" AND outcome='accepted' {order} LIMIT 1", (set_dir, qid)),
            (f"SELECT record, whole, carry_note, ts, seq FROM answer_log{self.sql.indexed_by('log_noted')}"
             f" WHERE {live} AND outcome='accepted' AND noted=1 AND sender=(SELECT sender FROM answer_log"
             f" WHERE {live} AND outcome='accepted' {order} LIMIT 1) {order} LIMIT 2", (set_dir, qid, set_dir, qid)),
            (f"SELECT record, ts, seq FROM answer_log WHERE {live} AND outcome='annotated' ORDER BY ts, seq",
             (set_dir, qid)),
            (_LATEST_POSTED, (set_dir, qid)),
        ]

    def projected(self, set_dir: str, qid: str, rows: list[list[tuple]]) -> dict[str, Any] | None:
        """The record made from what ``projection_reads`` read (an approval's
        casts and an older receipt are read here)."""
        counted, latest, noted, annotated, posted = rows
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
        if record is None or not self.audit_enabled:
            return record
        source = record.get("source") if isinstance(record.get("source"), dict) else {}
        if row is not None and source.get("event_id") == (picks[0][0].get("source") or {}).get("event_id"):
            if row[5] is not None:
                record["receipt"] = {"log": self.audit_origin(), "index": int(row[5]), "leaf": row[6]}
        elif record.get("state") == "answered" and source:
            # The record stands on an answer withdrawn since: a decision whose
            # every vote was withdrawn after it (the latest vote), an answer
            # that stood at the deadline.  Its receipt is that answer's.
            receipt = self.receipt_of(str(source.get("event_id")))
            if receipt is not None:
                record["receipt"] = receipt
        return record

    def _with_approval(self, posting: RecordedQuestion | None, base: dict[str, Any] | None,
                       count: int) -> dict[str, Any] | None:
        """``base`` as an approval's record (votes, a decision, an expiry) where
        the posting it stands on has a quorum or a deadline: the question's
        latest ``posting``, or the earlier revision's whose pick still stands
        (a revision without the approval's fields does not make a lone vote
        of the one before consent); else ``base`` itself."""
        if posting is None:
            return base
        earlier = self._earlier_revision_standing(posting, base)
        if earlier is not None:
            return self._with_approval(earlier, base, count)
        if posting.quorum is None and posting.expires_ms is None:
            return base
        if posting.quorum is None:
            base = self._stood_at_deadline(posting, base)
        casts = self.casts(posting.event_id) if posting.quorum is not None else []
        fallback = None
        if base is None and casts:
            row = self.db.execute("SELECT record FROM answer_log WHERE event_id=? AND outcome='accepted'"
                                  " ORDER BY seq DESC LIMIT 1", (casts[-1].event_id,)).fetchone()
            fallback = json.loads(row[0]) if row and row[0] else None
        return approval_record(base, posting, casts, expired=self.is_expired(posting.event_id), count=count,
                               fallback=fallback)

    def _earlier_revision_standing(self, posting: RecordedQuestion,
                                   base: dict[str, Any] | None) -> RecordedQuestion | None:
        """The earlier revision's posting the standing pick answers, when no
        pick stands on ``posting`` and its deadline has not passed: the record
        stays what that revision's approval made of it (its decision, its
        votes), as it was before anyone answered this one."""
        if base is None or of_revision(base, posting) is not None or self.is_expired(posting.event_id):
            return None
        if posting.quorum is not None and standing(self.casts(posting.event_id), NEVER):
            return None
        answered = (base.get("source") or {}).get("event_id")
        row = self.db.execute("SELECT p.event_id, p.open, p.closed_why FROM answer_log a JOIN posted p"
                              " ON p.event_id=a.question_event_id WHERE a.event_id=? AND a.outcome='accepted'"
                              " ORDER BY a.seq DESC LIMIT 1", (answered,)).fetchone()
        earlier = self._posting(row)
        return earlier if earlier is not None and earlier.event_id != posting.event_id else None

    def _stood_at_deadline(self, posting: RecordedQuestion, base: dict[str, Any] | None) -> dict[str, Any] | None:
        """A question with a deadline and no quorum, past it: the answer that
        stood at the deadline, in the room's order, though taken back since.
        Its deadline closed it with that answer standing (the room and the
        agent were told so), as a quorum's expiry keeps the votes that stood."""
        if posting.expires_ms is None or not self.is_expired(posting.event_id):
            return base
        stood = standing(self.casts(posting.event_id), (posting.expires_ms - 1, NEVER[1]))
        if not stood:
            return base
        last = max(stood.values(), key=lambda c: c.at)
        if base is not None and (base.get("source") or {}).get("event_id") in (last.event_id, last.original):
            return base
        row = self.db.execute("SELECT record FROM answer_log WHERE event_id=? AND outcome='accepted'"
                              " ORDER BY seq DESC LIMIT 1", (last.event_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] else base

    def casts(self, question_event_id: str) -> list[Cast]:
        """Every pick accepted for one posting, each with where in the room's
        order it was withdrawn (a redaction, an emptied poll vote), if it was."""
        out = []
        rows = self.db.execute(
            "SELECT event_id, sender, via, record, ts, seq, withdrawn, replaces FROM answer_log"
            " WHERE question_event_id=? AND outcome='accepted' ORDER BY ts, seq", (question_event_id,)).fetchall()
        for event_id, sender, via, record, ts, seq, withdrawn, replaces in rows:
            pick = json.loads(record) if record else {}
            choice, note = pick.get("choice"), pick.get("note")
            gone = NEVER
            if withdrawn:
                # The earliest of what withdrew it, in the room's order, whatever
                # order they reached the bridge in: a redaction, or (a poll vote)
                # an emptied vote, kept under the person's votes in this poll.
                found = [tuple(row) for row in self.db.execute(
                    "SELECT ts, seq FROM answer_log WHERE outcome='withdrawn' AND replaces IN (?, ?)"
                    " ORDER BY ts, seq LIMIT 1", (event_id, replaces or event_id)).fetchall()]
                # Or what the redactions kept say: the sender's own, or one that
                # counted (a moderator's), that found the pick already withdrawn
                # (by a later emptied vote or redaction read first) and so logged
                # nothing; or the sender's emptied vote after it.
                cleared = votes_key(question_event_id, sender) if via == "poll" else None
                kept = self.db.execute(
                    "SELECT MIN(r.ts) FROM redaction r WHERE (r.target IN (?, ?) AND (r.sender=? OR EXISTS"
                    " (SELECT 1 FROM processed p WHERE p.event_id=r.event_id AND p.outcome='withdrawn')))"
                    " OR (r.sender=? AND r.target=? AND r.ts>=?)",
                    (event_id, replaces or event_id, sender, sender, cleared, ts)).fetchone()
                if kept and kept[0] is not None:
                    found.append((kept[0], 0))
                # None found: withdrawn by what the log no longer tells apart; one
                # before the pick itself (in the room): it never stood.
                gone = max(min(found, default=(ts, seq)), (ts, seq))
            out.append(Cast(sender, choice if isinstance(choice, str) else None, event_id, (ts, seq), gone,
                            replaces, note if isinstance(note, str) else ""))
        return out
