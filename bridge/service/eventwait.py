"""Waiting for ``asyncio.Event``s, for a while or until one is set: the one way the bridge does it.

``asyncio.wait_for(event.wait(), seconds)`` looks the same, but in Python
3.11 a cancellation that arrives just as the event is set is swallowed:
``wait_for`` returns the event's result and the task runs on.  Whoever
cancelled the task and waits for its end then waits for ever.  The sync
loop did exactly that when a batch failed as PostgreSQL restarted: it
cancelled its notifier as it had just woken it, and waited for it; the
notifier ran on, the loop never ended, and its supervisor never started it
again (nothing more was made durable, and nothing was logged).
``asyncio.wait`` never swallows a cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def set_within(event: asyncio.Event, seconds: float | None) -> bool:
    """Whether ``event`` is set within ``seconds`` (None: no limit)."""
    if event.is_set():
        return True
    await any_set([event], seconds)
    return event.is_set()


async def any_set(events: Iterable[asyncio.Event], seconds: float | None = None) -> None:
    """Until one of ``events`` is set, or ``seconds`` have passed (None: no limit)."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
