"""Events waiting for their keys (encrypted rooms, issue 9): kept
(``undecrypted``) before the sync token moves past them, retried as keys
arrive, dropped once decrypted or given up on."""

from __future__ import annotations

import json
from typing import Any, Iterable


class Undecrypted:
    """A part of ``Store`` (store.py): the ``undecrypted`` table."""

    def keep_undecrypted(self, event: dict[str, Any], first_seen: int) -> bool:
        """Keep an event not decrypted yet; False when it was already kept."""
        cursor = self.db.execute(
            "INSERT INTO undecrypted(event_id, room_id, sender, event, first_seen) VALUES (?,?,?,?,?)"
            " ON CONFLICT DO NOTHING",
            (event["event_id"], event["room_id"], event["sender"], json.dumps(event), first_seen))
        return cursor.rowcount > 0

    def rekeep_undecrypted(self, event: dict[str, Any]) -> None:
        """A kept event kept as ``event`` from now on (its first_seen unchanged)."""
        self.db.defer("UPDATE undecrypted SET event=? WHERE event_id=?", (json.dumps(event), event["event_id"]))

    def undecrypted(self) -> list[tuple[dict[str, Any], int]]:
        """(event, first seen ms) of every kept event, oldest in the room first."""
        # In the room's order: events of one late session are judged as they were sent.
        rows = self.db.execute("SELECT event, first_seen FROM undecrypted").fetchall()
        kept = [(json.loads(event), first_seen) for event, first_seen in rows]
        kept.sort(key=lambda item: (_sort_ts(item[0].get("origin_server_ts")), item[1], str(item[0].get("event_id"))))
        return kept

    def undecrypted_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM undecrypted").fetchone()[0])

    def is_undecrypted(self, event_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM undecrypted WHERE event_id=?", (event_id,)).fetchone() is not None

    def drop_undecrypted(self, event_ids: Iterable[str]) -> None:
        self.db.executemany("DELETE FROM undecrypted WHERE event_id=?", [(e,) for e in event_ids])


def _sort_ts(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
