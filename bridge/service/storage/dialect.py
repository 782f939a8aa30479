"""What the store's SQL says differently on SQLite and on PostgreSQL, written
once for each.

Everything else the store sends is one text for both: ``INSERT ... ON
CONFLICT`` (not SQLite's ``INSERT OR IGNORE``), ``RETURNING`` where a key is
read back, ``?`` placeholders (psycopg's parameter style is ``%s``:
``pgdialect`` swaps the marks, nothing else).  The schema's migrations,
frozen once shipped, are SQLite's text made PostgreSQL's as they run
(``pgdialect._ddl``); they run once per store.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    name: str
    # After a text column in an ORDER BY: byte order.  SQLite's own for
    # text; a PostgreSQL database sorts by its host's language ("a" before
    # "B") unless told "C".  The store orders by text where the order decides
    # something (which of two redactions at one time counts, which edit is
    # judged first), so it must not depend on the backend.
    bytewise: str
    # SQLite's planner hint for a read whose partial index it would not pick
    # itself; PostgreSQL's planner picks its indexes itself and has no hint.
    hinted: bool

    def indexed_by(self, index: str) -> str:
        return f" INDEXED BY {index}" if self.hinted else ""


SQLITE = Dialect("sqlite", bytewise="", hinted=True)
POSTGRESQL = Dialect("postgresql", bytewise=' COLLATE "C"', hinted=False)
