"""Connections whose client stopped reading what the bridge sends it.

aiohttp's idle timeout counts only while no request is being handled; a
response being written waits for the client for ever.  A client that asks
for a big read (a set's answers, 13 MB) and never reads it held its
connection, a descriptor and the response's memory for good: sixty of them
pinned 1.6 GB.  Each listener's connections are watched here: one whose
unsent output has not gone down by ``MIN_RATE`` bytes a second, on average
over ``STALLED_SECONDS``, is cut off.  (Any progress at all was once enough:
a client reading a few bytes a minute kept a 13 MB view in memory for
hours, and one token could hold gigabytes that way within its rate budget.)
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

STALLED_SECONDS = 60.0  # a client that reads (next to) nothing of a response for a minute is gone
MIN_RATE = 16 * 1024  # bytes a second: what a request's body must keep up too (bodyread)
LOOK_EVERY = 5.0


def _unsent(transport: Any) -> int:
    """Bytes the client has not taken yet: the transport's buffer, and the
    kernel's send queue.  The buffer alone goes down in bursts (the kernel
    takes more only once a third of its megabytes of queue is free), so a
    client reading steadily at 20 KB/s showed no progress for a minute."""
    queued = 0
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except (OSError, ValueError):
            queued = 0  # not a kernel socket that says so: the buffer alone
    return transport.get_write_buffer_size() + max(0, queued)


class StalledWrites:
    def __init__(self, stalled_after: float | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stalled_after = STALLED_SECONDS if stalled_after is None else stalled_after
        self.every = LOOK_EVERY if every is None else every
        self.clock = clock
        # transport -> (its unsent bytes at the mark, the mark's time)
        self._watched: weakref.WeakKeyDictionary[Any, tuple[int, float]] = weakref.WeakKeyDictionary()
        self._task: asyncio.Future[None] | None = None

    def install(self, app: web.Application) -> None:
        app.middlewares.append(self._middleware)
        app.on_cleanup.append(self._stop)

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        transport = request.transport
        if transport is not None and transport not in self._watched:
            self._watched[transport] = (0, self.clock())
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._run())
        return await handler(request)

    async def _run(self) -> None:
        while self._watched:
            await asyncio.sleep(self.every)
            self.look()

    def look(self) -> int:
        """Cut off the connections stalled by now; how many."""
        now, cut = self.clock(), 0
        for transport, (marked, since) in list(self._watched.items()):
            if transport.is_closing():
                self._watched.pop(transport, None)
                continue
            unsent = _unsent(transport)
            if unsent == 0 or unsent > marked:
                self._watched[transport] = (unsent, now)  # nothing to read, or more written: a mark anew
            elif now - since >= self.stalled_after:
                read = marked - unsent
                if read >= MIN_RATE * (now - since):
                    self._watched[transport] = (unsent, now)
                    continue
                peer = transport.get_extra_info("peername")
                log.info("a client that read %d bytes in %.0f s, %d left to send, cut off (%s)", read, now - since,
                         unsent, peer)
                transport.abort()
                self._watched.pop(transport, None)
                cut += 1
        return cut

    async def _stop(self, _app: web.Application) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
