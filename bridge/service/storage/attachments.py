"""Files: those people sent (``attachment``: saved into the set folder, or
why not) and question media uploaded once (``media_upload``, by content hash)."""

from __future__ import annotations

import json
from typing import Any


class Attachments:
    """A part of ``Store`` (store.py): ``attachment`` and ``media_upload``."""

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        """(path, problem) of a file a person sent; None when it was never fetched."""
        row = self.db.execute("SELECT path, problem FROM attachment WHERE event_id=?", (event_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def attachment_count(self, set_dir: str, qid: str) -> int:
        return self.db.execute("SELECT COUNT(*) FROM attachment WHERE set_dir=? AND qid=?",
                               (set_dir, qid)).fetchone()[0]

    def coming_attachments(self, set_dir: str, qid: str, pending: str) -> int:
        """Files of the question recorded as still coming (``pending``: ``downloads.PENDING``)."""
        return self.db.execute("SELECT COUNT(*) FROM attachment WHERE set_dir=? AND qid=? AND path IS NULL"
                               " AND problem=?", (set_dir, qid, pending)).fetchone()[0]

    def record_attachment(self, event_id: str, set_dir: str, qid: str, path: str | None,
                          problem: str | None, url: str | None = None) -> None:
        """``url``: the content repository's URL of the file the event sent."""
        self.db.execute("INSERT INTO attachment(event_id, set_dir, qid, path, problem, url) VALUES (?,?,?,?,?,?)"
                        " ON CONFLICT DO NOTHING",
                        (event_id, set_dir, qid, path, problem, url))

    def attachment_url(self, event_id: str) -> str | None:
        """The URL of the file ``event_id`` sent, as recorded when it was fetched (None: not known)."""
        row = self.db.execute("SELECT url FROM attachment WHERE event_id=?", (event_id,)).fetchone()
        return row[0] if row else None

    def doom_if_unused(self, event_id: str) -> bool:
        """The file ``event_id`` brought, to be deleted when nothing it sent
        stands in the log (redacted while the file came, its question closed
        meanwhile: judged, it recorded nothing); whether it was.  An edit
        waiting for its original (``parked_edit``) is not judged yet: its
        file is kept for it."""
        row = self.db.execute(
            "SELECT a.set_dir, a.path FROM attachment a WHERE a.event_id=? AND a.path IS NOT NULL AND NOT EXISTS"
            " (SELECT 1 FROM answer_log l WHERE l.event_id=a.event_id AND l.outcome IN ('accepted','annotated')"
            " AND l.withdrawn=0) AND NOT EXISTS (SELECT 1 FROM parked_edit p WHERE p.event_id=a.event_id)",
            (event_id,)).fetchone()
        if row is None:
            return False
        self.db.execute("INSERT INTO doomed_file(set_dir, path) VALUES (?, ?) ON CONFLICT DO NOTHING", row)
        return True

    def settle_attachment(self, event_id: str, path: str | None, problem: str | None) -> None:
        """A file recorded as still coming (``downloads.PENDING``): now in, or why not."""
        self.db.execute("UPDATE attachment SET path=?, problem=? WHERE event_id=?", (path, problem, event_id))

    def upload_of(self, sha256: str) -> tuple[str, dict[str, Any]] | None:
        row = self.db.execute("SELECT url, info FROM media_upload WHERE sha256=?", (sha256,)).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def record_upload(self, sha256: str, url: str, info: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO media_upload(sha256, url, info) VALUES (?,?,?) ON CONFLICT DO NOTHING",
                        (sha256, url, json.dumps(info)))
