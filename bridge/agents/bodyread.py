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
from typing import Any

from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError

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


class BodyUnreadable(TooSlow):
    """A body that came but does not decode as its ``Content-Encoding``
    says (labelled gzip by a proxy, or broken by the client's compressor):
    the client's fault, said to it.  aiohttp's error went up through every
    route that reads a body: a plain-text 500 and a traceback in the log, on
    /mcp even for a request with a wrong token."""

    status = 400
    code = "bad_request"


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
        except RequestPayloadError as exc:
            raise unreadable(exc, received) from None
        received += len(chunk)
        yield chunk


def unreadable(exc: RequestPayloadError, received: int) -> TooSlow:
    """What aiohttp's ``RequestPayloadError`` means for the request: a body
    that does not decode (BodyUnreadable), or one cut short (BodyCut)."""
    if isinstance(exc.__cause__, ContentEncodingError):
        return BodyUnreadable("the body does not decode as its Content-Encoding says "
                              f"({exc.__cause__.message.strip()}); send it as it is, or encoded as the header says")
    return BodyCut(f"the body ended short after {received} bytes")


def closing_if_unreadable(request: Any, response: Any) -> Any:
    """``response``, closing its connection when the request's body does not
    decode: the rest of it can't be read past, so the connection carries no
    other request (aiohttp drops it after the answer, and a client that sent
    its next request on it had it reset)."""
    if isinstance(request.content.exception(), RequestPayloadError) and not response.prepared:
        response.force_close()
    return response


# Request bodies are read whole into memory (a set of up to 16 MB, an MCP
# call of up to 43 MB), and ``paced`` lets a slow one take minutes: one token
# holder sending thirty at 16 KB/s held 390 MB, and its rate budget allowed
# hundreds.  So only so many big bodies are read at once, per agent and in
# all; a small one (a close, a wait) is never held up.  A media file's PUT
# streams to disk instead, but a slow one holds a connection and a file as
# long: thirty at once were all held, so it is counted here too.
SMALL_BODY = 64 * 1024
BODIES_PER_AGENT = 4
BODIES_IN_ALL = 16
BODIES_RETRY_SECONDS = 5


class TooManyBodies(AgentError):
    status = 429
    code = "too_many_uploads"

    def __init__(self, message: str):
        super().__init__(message)
        self.retry_after = BODIES_RETRY_SECONDS
        self.headers = {"Retry-After": str(BODIES_RETRY_SECONDS)}


class BodyGate:
    """Counts the big request bodies being read, by agent."""

    def __init__(self, per_agent: int = BODIES_PER_AGENT, in_all: int = BODIES_IN_ALL):
        self.per_agent, self.in_all = per_agent, in_all
        self.reading: dict[str, int] = {}

    def take(self, agent: str, length: int | None) -> Callable[[], None]:
        """A place to read a body of ``length`` bytes (None: not said) in, or
        TooManyBodies; returns what gives it back (safe to call again)."""
        if length is not None and length <= SMALL_BODY:
            return lambda: None
        mine, everyone = self.reading.get(agent, 0), sum(self.reading.values())
        if mine >= self.per_agent:
            raise TooManyBodies(f"this agent is already sending {mine} large request bodies (at most "
                                f"{self.per_agent} at once); send this one once one of them is in")
        if everyone >= self.in_all:
            raise TooManyBodies(f"the bridge is reading {everyone} large request bodies (at most {self.in_all} at "
                                "once); try again shortly")
        self.reading[agent] = mine + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.reading[agent] -= 1
                if not self.reading[agent]:
                    del self.reading[agent]
        return give_back
