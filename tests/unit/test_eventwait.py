"""A task cancelled just as the event it waits for is set still ends
(``eventwait.set_within``).  In Python 3.11 ``asyncio.wait_for`` swallows
such a cancellation: the sync loop, its batch failed as PostgreSQL
restarted, cancelled its notifier as it had just woken it and waited for it
for ever, so nothing more was made durable (the failover storm)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bridge.service.answering.notices import Notices
from bridge.service.eventwait import set_within


async def _cancelled_as_woken(task: "asyncio.Task[object]", event: asyncio.Event) -> None:
    await asyncio.sleep(0.01)  # the task waits now
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=2)
    assert task in done, "the task ran on after it was cancelled"
    assert task.cancelled()


async def test_a_wait_cancelled_as_its_event_is_set_ends() -> None:
    event = asyncio.Event()
    await _cancelled_as_woken(asyncio.ensure_future(set_within(event, 60)), event)


async def test_a_notifier_cancelled_as_it_is_woken_ends() -> None:
    notices = Notices(SimpleNamespace(store=None), asyncio.Event())
    notices.pending.clear()
    notices.next_due = notices.clock() + 60  # its wait has a limit, as it has while a notice is due
    await _cancelled_as_woken(asyncio.ensure_future(notices.run()), notices.pending)


@pytest.mark.parametrize("seconds, expected", [(0.05, False), (None, True)])
async def test_set_within_says_whether_the_event_came(seconds: float | None, expected: bool) -> None:
    event = asyncio.Event()
    if expected:
        asyncio.get_running_loop().call_later(0.02, event.set)
    assert await set_within(event, seconds) is expected
