"""How many agents' waits are held now, per agent and in all, and the caps
on them (``agent_api.max_waits``, ``agent_api.max_waits_total``).

A held wait costs an event and an open connection, no thread and no
watcher; the caps keep one agent (or all of them) from holding the host's
descriptors.  A wait that waits also gives back the request it was charged:
the rate budget is for requests, the caps are for waits."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

from bridge.agents.errors import TooManyWaits

# What Retry-After says to a wait over a cap: waits end within their
# timeout (300 s at most), most far sooner.
RETRY_AFTER = 5


class Waits:
    """How many waits are held now, per agent and in all."""

    def __init__(self, per_agent: int = 100, total: int = 1000,
                 give_back: Callable[[str], None] | None = None):
        self.per_agent = per_agent
        self.total = total
        # The rate limiter's refund: a wait that waits costs no request.
        self.give_back = give_back
        self.held: Counter[str] = Counter()

    @contextlib.contextmanager
    def hold(self, agent: str) -> Iterator[None]:
        if self.held[agent] >= self.per_agent:
            raise TooManyWaits(f"this agent already holds {self.per_agent} waits (agent_api.max_waits); "
                               "let one end first", RETRY_AFTER)
        if sum(self.held.values()) >= self.total:
            raise TooManyWaits(f"the bridge already holds {self.total} waits (agent_api.max_waits_total)",
                               RETRY_AFTER)
        self.held[agent] += 1
        try:
            yield
        finally:
            self.held[agent] -= 1
            if self.held[agent] <= 0:
                del self.held[agent]
