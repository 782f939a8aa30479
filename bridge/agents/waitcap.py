"""How many agents' waits are held now, per agent and in all, and the caps
on them (``agent_api.max_waits``, ``agent_api.max_waits_total``).

A held wait costs an event and an open connection, no thread and no
watcher; the caps keep one agent (or all of them) from holding the host's
descriptors.  A wait that waits also gives back the request it was charged:
the rate budget is for requests, the caps are for waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

from bridge.agents.errors import TooManyWaits

# What Retry-After says to a wait over a cap: waits end within their
# timeout (300 s at most), most far sooner.
RETRY_AFTER = 5
# How often the held waits are looked over for waiters that left.
SWEEP_SECONDS = 2.0


class Waits:
    """How many waits are held now, per agent and in all."""

    def __init__(self, per_agent: int = 100, total: int = 1000,
                 give_back: Callable[[str], None] | None = None):
        self.per_agent = per_agent
        self.total = total
        # The rate limiter's refund: a wait that waits costs no request.
        self.give_back = give_back
        self.held: Counter[str] = Counter()
        self._watched: set[tuple[asyncio.Event, Callable[[], bool]]] = set()
        self._sweeper: asyncio.Future[None] | None = None

    @contextlib.contextmanager
    def hold(self, agent: str, wake: asyncio.Event | None = None,
             gone: Callable[[], bool] | None = None) -> Iterator[None]:
        """Hold one wait of ``agent``; TooManyWaits over a cap.  ``gone``: whether
        the waiter has left (its connection closed); ``wake`` is set when it has,
        so a wait nobody waits for gives its place back within SWEEP_SECONDS."""
        if self.held[agent] >= self.per_agent:
            raise TooManyWaits(f"this agent already holds {self.per_agent} waits (agent_api.max_waits); "
                               "let one end first", RETRY_AFTER)
        if sum(self.held.values()) >= self.total:
            raise TooManyWaits(f"the bridge already holds {self.total} waits (agent_api.max_waits_total)",
                               RETRY_AFTER)
        self.held[agent] += 1
        watched = (wake, gone) if wake is not None and gone is not None else None
        if watched is not None:
            self._watched.add(watched)
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.ensure_future(self._sweep())
        try:
            yield
        finally:
            self._watched.discard(watched)
            self.held[agent] -= 1
            if self.held[agent] <= 0:
                del self.held[agent]

    async def _sweep(self) -> None:
        """One task for all the held waits: wake each whose waiter has left."""
        while self._watched:
            await asyncio.sleep(SWEEP_SECONDS)
            for wake, gone in list(self._watched):
                if gone():
                    wake.set()
