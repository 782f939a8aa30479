"""The pages of a listing over MCP (``resources/list``).  Pure.

Every set's answers and every file of them in one message passed, at a few
thousand sets, the 1 MiB a client reads of one message (the Python SDK's
limit on a server-sent event), and the agent could list nothing at all.  A
page holds ``SETS_A_PAGE`` sets (their answers and their files); its cursor
names the last set on it, so a set made or removed between two pages moves
no other set onto a page twice or off all of them.
"""

from __future__ import annotations

import base64
import binascii
import bisect

SETS_A_PAGE = 100


class BadCursor(ValueError):
    pass


def page(set_ids: list[str], cursor: str | None, size: int = SETS_A_PAGE) -> tuple[list[str], str | None]:
    """The sets on the page ``cursor`` names (the first page: None), in
    order, and the next page's cursor (None: this is the last)."""
    ordered = sorted(set_ids)
    start = 0 if cursor is None else bisect.bisect_right(ordered, _after(cursor))
    taken = ordered[start:start + size]
    more = start + size < len(ordered)
    return taken, (base64.urlsafe_b64encode(taken[-1].encode()).decode("ascii") if more and taken else None)


def _after(cursor: str) -> str:
    try:
        return base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        raise BadCursor("this cursor was not given by this bridge (give the nextCursor of the page before)") from None
