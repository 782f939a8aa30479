"""Which people a ``/keys/query`` answer speaks for, and when to ask again
about the others.

A homeserver answers for remote people by asking their homeservers; one
that does not answer is named in ``failures`` and its people are left out
of ``device_keys`` (Synapse may still give some from its cache, without
the cross-signing keys it could not fetch).  Such an answer says nothing
about those people: it must not be read as "no devices", nor "no signed
devices".  They are asked again, later and later (``Retries``), and what
was known of them stays until an answer comes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

FIRST_RETRY_MS = 1000
LAST_RETRY_MS = 60_000


def server_of(user_id: str) -> str:
    """The server part of a user id (``@alice:example.org`` -> ``example.org``)."""
    return user_id.split(":", 1)[1] if ":" in user_id else ""


def failed_servers(response: dict[str, Any]) -> set[str]:
    failures = response.get("failures")
    return {str(server) for server in failures} if isinstance(failures, dict) else set()


def answered(asked: Iterable[str], response: dict[str, Any]) -> set[str]:
    """The users of ``asked`` this response settles: present in
    ``device_keys`` (even with no device), and their server not named in
    ``failures``."""
    device_keys = response.get("device_keys")
    if not isinstance(device_keys, dict):
        return set()
    failed = failed_servers(response)
    return {user for user in asked if isinstance(device_keys.get(user), dict) and server_of(user) not in failed}


def delay_ms(attempts: int) -> int:
    """How long after the ``attempts``-th unanswered ask the next one goes."""
    return min(FIRST_RETRY_MS * 2 ** max(0, attempts - 1), LAST_RETRY_MS)


@dataclass
class Retries:
    """People asked about and not answered for yet: when each is due again."""

    _due: dict[str, tuple[int, int]] = field(default_factory=dict)  # user -> (due at ms, unanswered asks)

    def __contains__(self, user_id: object) -> bool:
        return user_id in self._due

    def __len__(self) -> int:
        return len(self._due)

    def add(self, users: Iterable[str], now: int) -> None:
        """Users to ask about: due now, unless already waiting for their next ask."""
        for user in users:
            self._due.setdefault(user, (now, 0))

    def due(self, now: int) -> set[str]:
        return {user for user, (at, _attempts) in self._due.items() if at <= now}

    def unanswered(self, users: Iterable[str], now: int) -> int:
        """``users`` were asked at ``now`` and not answered for: each is due
        again after its own backoff; the shortest wait, in ms."""
        waits = []
        for user in users:
            attempts = self._due.get(user, (now, 0))[1] + 1
            wait = delay_ms(attempts)
            self._due[user] = (now + wait, attempts)
            waits.append(wait)
        return min(waits, default=0)

    def answered(self, users: Iterable[str]) -> None:
        for user in users:
            self._due.pop(user, None)

    def due_in_ms(self, now: int) -> int | None:
        """How long until someone is due (None: nobody is waiting)."""
        if not self._due:
            return None
        return max(0, min(at for at, _attempts in self._due.values()) - now)
