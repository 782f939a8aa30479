"""How far bot mode has read a limited sync's gap, kept in the store.

A gap is read forward from the sync token in the store (``gap_pages``), a
page at a time, each page made durable in a commit of its own; the token
moves only with the sync's own events, at the end.  A stop (or a crash) in
a gap of days of chatter left nothing to say where the read was, and the
next start read it all again from the token, and again after each stop.

So each page's commit also keeps where the read goes on (``GAP_AT`` + room
id: the token the read started from, and the page's end), and a read of
the same room from the same token goes on from there.  The page's events
and the mark are in one commit: none is past what is durable, and nothing
durable is read again.  The batch's final commit, which moves the sync
token past the gap, forgets the marks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# meta: + room id -> JSON [the token the gap was read from, where the read goes on].
GAP_AT = "gap_at:"

# Room id -> (the token its gap's read started from, where it goes on).
GapsRead = dict[str, tuple[str, str]]


@dataclass(frozen=True)
class GapPage:
    """A page of a gap: its events, and where the read goes on past them."""

    events: list[dict[str, Any]]
    room_id: str
    origin: str  # the token the room's gap is read from (the sync token, or where the bridge left the room)
    at: str  # where the read goes on once these events are durable


def went_on_from(read: Mapping[str, tuple[str, str]] | None, room_id: str, origin: str) -> str:
    """Where the read of ``room_id``'s gap from ``origin`` begins: where a
    read from the same token got to, else ``origin`` (a mark from another
    token is of a gap since left behind)."""
    mark = (read or {}).get(room_id)
    return mark[1] if mark is not None and mark[0] == origin else origin


def gaps_read(rows: Iterable[tuple[str, str]]) -> GapsRead:
    """The marks of ``meta_with_prefix(GAP_AT)`` (one unreadable: none, its gap read from its start)."""
    read: GapsRead = {}
    for key, value in rows:
        try:
            origin, at = json.loads(value)
        except (ValueError, TypeError):
            continue
        if isinstance(origin, str) and isinstance(at, str):
            read[key[len(GAP_AT):]] = (origin, at)
    return read


def keep_gap_read(store: Any, page: GapPage) -> None:
    """In the commit of ``page``'s events."""
    store.set_meta(GAP_AT + page.room_id, json.dumps([page.origin, page.at]))


def forget_gaps_read(store: Any, rooms: Iterable[str]) -> None:
    """In the commit that moves the sync token past the gaps."""
    for room in rooms:
        store.delete_meta(GAP_AT + room)
