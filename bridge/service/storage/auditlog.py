"""The answer log's leaves and checkpoints in the store (both backends).

Leaves are appended in the transaction of the outcome they record (the
store calls ``append`` from the same connection inside it), so a crash
leaves both or neither: no outcome without its leaf, no leaf twice.  Indexes
are dense from 0, the next one read inside that transaction (only the
leader writes, and SQLite's BEGIN IMMEDIATE / the leader's fence on
PostgreSQL keep writers one at a time).  Hashes are kept as hex text so the
same SQL serves SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any, Iterable

from bridge.protocol import audit_leaf, merkle

# Checkpoints taken at most this many per call of ``checkpoints`` (newest kept).
CHECKPOINTS_LISTED = 1000


class LastLogged:
    """A leaf's ``seq``: the answer-log entry inserted just before it, read
    inside the leaf's own INSERT (the highest: only the leader writes)."""


LAST_LOGGED = LastLogged()
# A leaf at the next index; its seq a parameter, or (``LAST_LOGGED``) the log's newest.
_APPEND_LEAF = "INSERT INTO audit_leaf(idx, leaf, hash, seq) SELECT COALESCE(MAX(idx) + 1, 0), ?, ?, {} FROM audit_leaf"


class AuditLog:
    """The ``audit_leaf`` and ``audit_checkpoint`` tables through a store connection."""

    def __init__(self, db: Any):
        self.db = db

    def append(self, leaf: dict[str, Any], seq: "int | None | LastLogged") -> None:
        """Append one leaf (its canonical bytes and hash), at the next index;
        sent with the next statement that waits (``defer``)."""
        data = audit_leaf.canonical(leaf)
        leaf_row = (data.decode("utf-8"), merkle.leaf_hash(data).hex())
        if isinstance(seq, LastLogged):
            self.db.defer(_APPEND_LEAF.format("(SELECT MAX(seq) FROM answer_log)"), leaf_row)
        else:
            self.db.defer(_APPEND_LEAF.format("?"), (*leaf_row, seq))

    def size(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM audit_leaf").fetchone()[0])

    def hashes(self, end: int | None = None) -> list[bytes]:
        """The leaf hashes of the first ``end`` leaves (all when None), in order."""
        if end is None:
            rows = self.db.execute("SELECT hash FROM audit_leaf ORDER BY idx").fetchall()
        else:
            rows = self.db.execute("SELECT hash FROM audit_leaf WHERE idx<? ORDER BY idx", (end,)).fetchall()
        return [bytes.fromhex(h) for (h,) in rows]

    def hashes_from(self, start: int) -> list[tuple[int, bytes]]:
        """(index, leaf hash) from index ``start`` on, in order."""
        rows = self.db.execute("SELECT idx, hash FROM audit_leaf WHERE idx>=? ORDER BY idx", (start,)).fetchall()
        return [(int(idx), bytes.fromhex(h)) for idx, h in rows]

    def leaves(self, start: int, end: int) -> list[tuple[int, str]]:
        """(index, canonical JSON) of the leaves start <= index < end."""
        return [(int(i), leaf) for i, leaf in self.db.execute(
            "SELECT idx, leaf FROM audit_leaf WHERE idx>=? AND idx<? ORDER BY idx", (start, end)).fetchall()]

    def leaves_and_hashes(self, start: int, end: int) -> list[tuple[int, str, str]]:
        """(index, canonical JSON, stored hash hex) of the leaves start <= index < end."""
        return [(int(i), leaf, h) for i, leaf, h in self.db.execute(
            "SELECT idx, leaf, hash FROM audit_leaf WHERE idx>=? AND idx<? ORDER BY idx", (start, end)).fetchall()]

    def receipt(self, seq: int) -> tuple[int, str] | None:
        """(index, leaf hash hex) of the newest leaf of answer-log entry ``seq``."""
        row = self.db.execute("SELECT idx, hash FROM audit_leaf WHERE seq=? ORDER BY idx DESC LIMIT 1",
                              (seq,)).fetchone()
        return (int(row[0]), row[1]) if row else None

    def keep_checkpoint(self, size: int, note: str, at_ms: int) -> None:
        self.db.execute("INSERT INTO audit_checkpoint(size, note, at) VALUES (?,?,?)"
                        " ON CONFLICT DO NOTHING", (size, note, at_ms))

    def latest_checkpoint(self) -> tuple[int, str] | None:
        row = self.db.execute("SELECT size, note FROM audit_checkpoint ORDER BY size DESC LIMIT 1").fetchone()
        return (int(row[0]), row[1]) if row else None

    def all_checkpoints(self) -> list[tuple[int, str]]:
        return [(int(s), n) for s, n in self.db.execute(
            "SELECT size, note FROM audit_checkpoint ORDER BY size").fetchall()]

    def checkpoints(self) -> list[tuple[int, str]]:
        rows = self.db.execute("SELECT size, note FROM audit_checkpoint ORDER BY size DESC LIMIT ?",
                               (CHECKPOINTS_LISTED,)).fetchall()
        return [(int(s), n) for s, n in reversed(rows)]


def leaf_sets(leaves: Iterable[tuple[int, str]]) -> dict[int, str | None]:
    """index -> the set a leaf is about (for an agent's view of its own sets)."""
    out: dict[int, str | None] = {}
    for index, data in leaves:
        try:
            out[index] = audit_leaf.parse_leaf(data.encode()).get("set")
        except audit_leaf.LeafError:
            out[index] = None
    return out
