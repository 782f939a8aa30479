"""Whose turn it is to download: the media's connections shared out by
the server a file comes from and the person who sent it.

One pool of turns for every room once let a single slow source hold them
all: a homeserver fetching a file from a slow federated server sends nothing
until it has it whole, so a try of a file near the limit waits minutes for
its first byte (``attachments.try_seconds``), three tries a file.  Thirty-two
such files, from one person or one server, took every turn, and every other
room's files waited behind them.  Now a server and a person each get a
bounded share, and a download waits for a turn only once its shares have
room: one queued behind its own server's share holds no turn anyone else
could use.  The people of one homeserver share too: many accounts there,
each naming files on other slow servers, took every turn again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from bridge.service.transport.mediasession import MEDIA_CONNECTIONS

# A quarter of the turns a server: it takes four slow servers at once to
# fill them.  Files from one server share that server's link (and its
# media store), so more than eight of them side by side come no faster,
# each only slower; the bridge's own homeserver, where most files come
# from, is one server too, and eight of its files at once still leave
# room for the others.
PER_ORIGIN = 8
# Half a server's share a person: the server a file names is the sender's
# to choose (any mxc URL), so only a share of their own bounds a person, and
# one person sending a burst leaves room for the other people on their server.
# Their further files follow as each lands.
PER_SENDER = 4
# A server's share for the people on it (the server in their user id): a
# homeserver's accounts are its operator's to make, so people alone bound
# nothing when that operator is the one sending.  The bridge's own
# homeserver, where most people are, is one too: its files mostly come
# from itself, already held to PER_ORIGIN.
PER_PEOPLES_SERVER = 8


def server_of(user_id: str) -> str:
    """The homeserver of a user id, the key of its people's share."""
    return user_id.partition(":")[2].lower()


def origin_of(mxc: str | None) -> str:
    """The server name of an mxc URL, the key of its share ("" for none)."""
    if not isinstance(mxc, str):
        return ""
    return mxc.removeprefix("mxc://").partition("/")[0].lower()


class MediaTurns:
    """At most ``at_once`` downloads at a time, ``per_origin`` of them from
    one server, ``per_sender`` of them from one person and
    ``per_peoples_server`` from the people of one homeserver.  A turn is
    given only when all have room (never one held while waiting for
    another), to the longest-waiting download that fits."""

    def __init__(self, at_once: int = MEDIA_CONNECTIONS, per_origin: int = PER_ORIGIN,
                 per_sender: int = PER_SENDER, per_peoples_server: int = PER_PEOPLES_SERVER):
        self.at_once, self.per_origin, self.per_sender = at_once, per_origin, per_sender
        self.per_peoples_server = per_peoples_server
        self.running = 0
        self._origins: Counter[str] = Counter()
        self._senders: Counter[str] = Counter()
        self._peoples_servers: Counter[str] = Counter()
        # Downloads waiting, in the order they came (a dict: one leaving is
        # dropped at once wherever it stands); none of them fits now.
        self._waiting: dict[asyncio.Future[None], tuple[str, str]] = {}

    def of(self, origin: str, sender: str) -> Turn:
        """The turn of a file from ``origin`` sent by ``sender``: taken for each try, given back after it."""
        return Turn(self, origin, sender)

    def _shares(self, origin: str, sender: str) -> tuple[tuple[Counter[str], str, int], ...]:
        """Each share a file from ``origin`` sent by ``sender`` counts in: (its counts, its key, its limit)."""
        return ((self._origins, origin, self.per_origin), (self._senders, sender, self.per_sender),
                (self._peoples_servers, server_of(sender), self.per_peoples_server))

    def _fits(self, origin: str, sender: str) -> bool:
        return self.running < self.at_once and all(
            counts[key] < limit for counts, key, limit in self._shares(origin, sender))

    def _take(self, origin: str, sender: str) -> None:
        self.running += 1
        for counts, key, _limit in self._shares(origin, sender):
            counts[key] += 1

    def _give(self, origin: str, sender: str) -> None:
        self.running -= 1
        # Emptied shares go: one key per server or person ever seen would grow for ever.
        for counts, key, _limit in self._shares(origin, sender):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        self._hand_out()

    def _hand_out(self) -> None:
        for waiter, (origin, sender) in list(self._waiting.items()):
            if self.running >= self.at_once:
                return
            if waiter.done():
                continue  # cancelled: it leaves the queue as its task wakes
            if self._fits(origin, sender):
                del self._waiting[waiter]
                self._take(origin, sender)
                waiter.set_result(None)

    async def take(self, origin: str, sender: str) -> None:
        # Every download that could fit was handed its turn as the last one
        # ended, so one that fits now jumps no one.
        if self._fits(origin, sender):
            self._take(origin, sender)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[waiter] = (origin, sender)
        try:
            await waiter
        except asyncio.CancelledError:
            if self._waiting.pop(waiter, None) is None and waiter.done() and not waiter.cancelled():
                self._give(origin, sender)  # handed its turn as it was cancelled: it goes to the next
            raise

    def give(self, origin: str, sender: str) -> None:
        self._give(origin, sender)


class Turn:
    """A file's turn, as an async context manager taken again for each try."""

    def __init__(self, turns: MediaTurns, origin: str, sender: str):
        self.turns, self.origin, self.sender = turns, origin, sender

    async def __aenter__(self) -> None:
        await self.turns.take(self.origin, self.sender)

    async def __aexit__(self, *_exc: Any) -> None:
        self.turns.give(self.origin, self.sender)
