"""Bot mode's next long poll, sent while the batch before it is committed.

A bare client asks for its next ``/sync`` as soon as a response arrives;
the bridge must judge the batch and make it durable first, and asking
before that put the request's own cost (about 0.4 ms of the event loop:
nio and aiohttp build it) in front of every answer.  Instead the batch's
commit callback, which runs on the store's thread once the batch's
answers are in their folders, hands the request to the event loop, which
sends it while the thread waits for the store's COMMIT (the disk, or the
database's round trip).  The long poll is out while the batch is made
durable, and nothing of the batch waits for it.

Only the request runs ahead: its response is handled once the batch is
durable, and the token in the store moves only in a batch's commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

FirstSync = tuple[str | None, "asyncio.Future[Any]"]  # (the token it was asked from, the sync)


class NextPoll:
    def __init__(self, ask: Callable[[], Awaitable[FirstSync]]):
        self._loop = asyncio.get_running_loop()
        self._ask = ask
        self._task: asyncio.Future[FirstSync] | None = None
        self._dropped = False

    def now(self) -> None:
        """Ask for it (from any thread: the commit callback runs on the store's)."""
        self._loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self._task is None and not self._dropped:
            self._task = asyncio.ensure_future(self._ask())

    async def asked(self) -> FirstSync:
        """The long poll: asked now if the batch ended without its commit."""
        self._start()
        assert self._task is not None
        return await self._task

    async def drop(self) -> None:
        """The batch was not made durable: its long poll, if asked, is cancelled."""
        self._dropped = True
        task, self._task = self._task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
        asked = await asyncio.gather(task, return_exceptions=True)
        await drop_sync(asked[0] if isinstance(asked[0], tuple) else None)


async def drop_sync(ahead: FirstSync | None) -> None:
    """Cancel a sync asked ahead whose response will not be handled."""
    if ahead is not None:
        ahead[1].cancel()
        await asyncio.gather(ahead[1], return_exceptions=True)
