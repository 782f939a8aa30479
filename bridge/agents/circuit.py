"""One webhook destination's circuit breaker (pure: the caller passes the time).

Closed: up to ``PER_URL`` deliveries to the URL at once.  After
``OPEN_AFTER`` attempts in a row that fail (no 2xx: a timeout, a refused
connection, an error status) the circuit opens: nothing is sent to that URL
until ``open_until``, which backs off from 1 s doubling to 5 minutes each
time it opens again.  Then it is half-open: one delivery goes as a probe;
if the URL takes it the circuit closes, if not it opens for longer.  A
429 or 503 that asked to be left alone (``Retry-After``) holds the circuit
open that long, whatever the count, and a URL taking a delivery meanwhile
(one sent before it asked) does not end it.  Only that URL waits; every
other URL has a circuit of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

PER_URL = 4          # deliveries in flight to one URL at most
OPEN_AFTER = 3       # failures in a row that open the circuit
FIRST_OPEN = 1.0     # seconds the circuit first stays open
MAX_OPEN = 300.0


def doubling(times: int, first: float, most: float) -> float:
    """``first`` doubled ``times`` times, at most ``most`` (pure).  The
    exponent is capped before the power: ``2.0 ** 1024`` overflows, which a
    URL failing for days reached, and raised where it should have waited."""
    return min(most, first * 2.0 ** min(max(0, times), 64))


CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half-open"


@dataclass
class Circuit:
    failures: int = 0       # attempts in a row not taken
    opened: int = 0         # times opened in a row (the backoff's exponent)
    open_until: float = 0.0
    probing: bool = False   # a half-open probe is in flight
    failed_at: float = 0.0  # when the last attempt failed
    held_until: float = 0.0  # the URL asked to be left alone until then

    def state(self, now: float) -> str:
        if now < self.held_until:
            return OPEN
        if self.failures < OPEN_AFTER:
            return CLOSED
        return OPEN if now < self.open_until or self.probing else HALF_OPEN

    def room(self, now: float, in_flight: int) -> int:
        """How many more deliveries may start now."""
        state = self.state(now)
        if state == CLOSED:
            return max(0, PER_URL - in_flight)
        if state == HALF_OPEN and in_flight == 0:
            return 1
        return 0

    def started(self, now: float) -> None:
        if self.state(now) == HALF_OPEN:
            self.probing = True

    def taken(self) -> None:
        """Ends the count of failures, not a hold the URL asked for: a 2xx to
        a delivery sent before its 429 or 503 says nothing of how long it
        asked to be left alone."""
        self.failures = 0
        self.opened = 0
        self.open_until = 0.0
        self.probing = False

    def failed(self, now: float, hold: float = 0.0) -> None:
        self.failures += 1
        self.probing = False
        self.failed_at = now
        self.held_until = max(self.held_until, now + hold)
        if self.failures >= OPEN_AFTER and now >= self.open_until:
            self.open_until = now + doubling(self.opened, FIRST_OPEN, MAX_OPEN)
            self.opened += 1

    def reopens_at(self, now: float) -> float | None:
        """When an open circuit lets a probe through (None: not waiting on time)."""
        return max(self.open_until, self.held_until) if self.state(now) == OPEN and not self.probing else None
