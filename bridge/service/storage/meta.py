"""The ``meta`` table: small named values, one row per key (the sync token,
the bridge's login, the answer log's origin and key, where a catch-up ended,
what a posting's deadline and closing have done).  The callers name the keys;
families of keys share a prefix (``meta_with_prefix``)."""

from __future__ import annotations

# Key prefix: a room that refused a poll for good (its power levels): its
# later questions are posted without one, until its power levels change.
ROOM_REFUSED_POLLS = "room_refused_polls:"


class Meta:
    """A part of ``Store`` (store.py): the ``meta`` table through ``self.db``."""

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.defer("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                      (key, value))

    def delete_meta(self, key: str) -> None:
        self.db.defer("DELETE FROM meta WHERE key=?", (key,))

    def meta_with_prefix(self, prefix: str) -> list[tuple[str, str]]:
        """(key, value) of every meta row whose key starts with ``prefix``."""
        rows = self.db.execute(f"SELECT key, value FROM meta WHERE substr(key, 1, ?)=? ORDER BY key{self.sql.bytewise}",
                               (len(prefix), prefix)).fetchall()
        return [(key, value) for key, value in rows]
