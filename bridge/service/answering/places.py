"""The files an answer may still take, handed out in the room's order.

A batch's files are fetched side by side.  Counting a place gone as soon as
a file's download starts made a refused file (too large, not fetched, not
saved) cost a place anyway: a good file after it was refused as one too
many.  Here a file past the free places waits for one an earlier file gives
back, and is one too many only once no place can come back (every file
holding one is in).  A file still coming when its batch went on keeps its
place for the batches after it, as it keeps its turn in the room."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Fetched = tuple[str | None, str | None]  # (the saved path, None) or (None, why it was not kept)
FULL: Fetched = (None, "too_many_attachments")


class Places:
    def __init__(self, free: int):
        self.free = free
        self.holding = 0  # files fetching with a place: each may still give it back
        # Files handed here and not judged yet: while any is, the answer's
        # record does not hold them, and later batches share these places.
        self.owed = 0
        self._changed = asyncio.Condition()

    async def fetched(self, fetch: Callable[[], Awaitable[Fetched]]) -> Fetched:
        """``fetch`` once a place is had; FULL when none is, nor can be."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.free > 0 or self.holding == 0)
            if self.free <= 0:
                return FULL
            self.free -= 1
            self.holding += 1
        kept = False
        try:
            result = await fetch()
            kept = result[0] is not None
            return result
        finally:
            async with self._changed:
                self.holding -= 1
                if not kept:
                    self.free += 1
                self._changed.notify_all()
