"""Which agent a bearer token is, and whether it may make another request
now.  Tokens are compared in constant time and never logged or echoed."""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bridge.service.config import Agent


def agent_for(header: str | None, agents: Mapping[str, Agent]) -> str | None:
    """The agent named by an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, given_text = (header or "").partition(" ")
    if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 7235)
        return None
    # Bytes no UTF-8 (aiohttp keeps them as surrogates): compared as they came, a 401, never a 500.
    given = given_text.strip().encode("utf-8", "surrogateescape")
    found = None
    for name, agent in agents.items():
        # Every token is compared, so the time taken says nothing about which matched.
        if agent.token and hmac.compare_digest(given, agent.token.encode()) and found is None:
            found = name
    return found


# A second credential folded into one value, as a proxy joining two
# Authorization headers writes it ("Bearer a, Bearer b"): an auth scheme
# (RFC 9110 11.4) after a comma.  A bearer token has no comma (RFC 6750 2.1).
_FOLDED = re.compile(r",\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+\s+\S")


def credentials_in(values: Iterable[str]) -> int:
    """How many credentials a request's ``Authorization`` headers carry.
    The field is a singleton: with two, taking the first (as was done) let
    whatever put the other one there choose the agent, so two are refused."""
    return sum(1 + len(_FOLDED.findall(value)) for value in values)


@dataclass
class RateLimiter:
    """A token bucket per agent: ``per_minute`` requests a minute, bursts up to a minute's worth."""

    per_minute: int
    clock: Callable[[], float] = time.monotonic
    refunds_per_minute: int | None = None
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    _refunds: dict[str, tuple[float, float]] = field(default_factory=dict)  # ``give_back``'s own bucket

    def allow(self, agent: str) -> bool:
        now = self.clock()
        level, at = self._buckets.get(agent, (float(self.per_minute), now))
        level = min(float(self.per_minute), level + (now - at) * self.per_minute / 60.0)
        if level < 1.0:
            self._buckets[agent] = (level, now)
            return False
        self._buckets[agent] = (level - 1.0, now)
        return True

    def give_back(self, agent: str) -> None:
        """Return one request to the bucket (a wait that waits is not
        charged), at most ``refunds_per_minute`` a minute (by default the
        budget again): waits held and dropped over and over add at most that
        to an agent's requests."""
        now = self.clock()
        most = float(self.refunds_per_minute or self.per_minute)
        refunds, at = self._refunds.get(agent, (most, now))
        refunds = min(most, refunds + (now - at) * most / 60.0)
        if refunds < 1.0:
            self._refunds[agent] = (refunds, now)
            return
        self._refunds[agent] = (refunds - 1.0, now)
        level, at = self._buckets.get(agent, (float(self.per_minute), now))
        self._buckets[agent] = (min(float(self.per_minute), level + 1.0), at)

    def retry_after(self, agent: str) -> int:
        level, _at = self._buckets.get(agent, (0.0, 0.0))
        return max(1, int((1.0 - level) * 60.0 / self.per_minute) + 1)
