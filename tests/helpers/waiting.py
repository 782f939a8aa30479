"""Waiting in a test for what the bridge, a server or a person does next."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable


async def until(check: Callable[[], Any], timeout: float = 20, what: str = "condition", *,
                every: float = 0.05) -> Any:
    """Ask ``check`` (plain or async) every ``every`` seconds until it gives
    something true, and return that; an AssertionError naming ``what`` once
    ``timeout`` seconds pass.  It is asked once more at the deadline, so a slow
    last step is not failed for the poll's own sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(every)
