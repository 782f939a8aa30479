"""One send at a time, best first, so a rate limit delays the right things.

Under the homeserver's message rate limit (Synapse: 0.2/s, burst 10, unless
the operator lifts it for the bridge's account) every send may wait out a
429.  Sends take turns through one slot in priority order: a person's
acknowledgement waits for at most the one send in flight, never behind the
rest of a posting or a pile of refusals.  Without a rate limit a turn costs
nothing worth measuring (sends to one homeserver are sequential anyway).

The priority is a context variable, set by the task that sends
(``with priority(ACK):``), so no call between it and the transport has to
pass it along.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
from collections.abc import Iterator

ACK, QUESTION, REFUSAL = 0, 1, 2
_current: contextvars.ContextVar[int] = contextvars.ContextVar("send_priority", default=QUESTION)


@contextlib.contextmanager
def priority(level: int) -> Iterator[None]:
    token = _current.set(level)
    try:
        yield
    finally:
        _current.reset(token)


class Slot:
    """A lock granted in (priority, arrival) order."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self):  # type: ignore[no-untyped-def]
        if self._busy or self._waiting:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (_current.get(), next(self._arrival), future))
            try:
                await future
            except BaseException:
                if future.done() and not future.cancelled():
                    self._release()  # granted while being cancelled: pass the turn on
                else:
                    self._waiting = [w for w in self._waiting if w[2] is not future]
                    heapq.heapify(self._waiting)
                raise
        else:
            self._busy = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _level, _n, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot passes straight to it: still busy
                return
        self._busy = False
