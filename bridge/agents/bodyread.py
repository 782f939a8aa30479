"""A request body read against the clock.

A client that sends its headers and a few bytes of body, then stalls (or
sends a trickle), held its connection, and a descriptor of the bridge's,
for as long as it liked: one token holder could run the bridge out of
descriptors within its rate budget.  A body must keep coming: no gap of
``STALL_SECONDS``, and after ``GRACE_SECONDS`` on average at least
``MIN_RATE`` bytes a second (a 16 MB set in under 18 minutes, far slower
than any real uplink); otherwise the read ends with 408 ``too_slow``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from bridge.agents.errors import AgentError

STALL_SECONDS = 20.0
GRACE_SECONDS = 20.0
MIN_RATE = 16 * 1024


class TooSlow(AgentError):
    status = 408
    code = "too_slow"


class BodyCut(TooSlow):
    """The client went away before its body was whole: nobody is left to
    answer, and no fault of the bridge's (it was logged as an error, with a
    traceback, at every dropped connection)."""

    status = 400
    code = "body_cut"


def time_left(started: float, now: float, received: int) -> float:
    """How long the next bytes may take to come (<= 0: too late already)."""
    behind_at = started + GRACE_SECONDS + received / MIN_RATE  # when the average falls under MIN_RATE
    return min(STALL_SECONDS, behind_at - now)


async def paced(chunks: AsyncIterator[bytes], clock: Callable[[], float] = time.monotonic) -> AsyncIterator[bytes]:
    """``chunks`` as they come, or TooSlow when they stop coming in time."""
    started, received = clock(), 0
    source = chunks.__aiter__()
    while True:
        left = time_left(started, clock(), received)
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            chunk = await asyncio.wait_for(source.__anext__(), left)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise TooSlow(f"the body stopped coming ({received} bytes in {clock() - started:.0f} s); "
                          "send it again") from None
        except ConnectionError:
            raise BodyCut(f"the connection closed after {received} bytes of the body") from None
        received += len(chunk)
        yield chunk
