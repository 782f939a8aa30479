"""Joining the configured rooms without letting one room hold up the others.

At start every room is tried until it is joined or refuses for good (the
bridge was kicked from an invite-only room, the room is gone): a homeserver
that is not up yet is waited for, as before, but a room that refuses is
left to a background task that keeps asking, with backoff, and hands the
room over once it is joined.  The other rooms are served meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from bridge.service.eventwait import set_within
from bridge.service.transport.matrix import MatrixError

log = logging.getLogger(__name__)

RETRY_MAX = 300.0


def configured_rooms(config: Any) -> list[str]:
    """The rooms of the config (ids or aliases), the default first; an invite
    back into one of them is welcome even while it can't be joined."""
    return list(dict.fromkeys([config.rooms.default, *config.rooms.sets.values()]))


class RoomIds:
    """The configured rooms (ids or aliases) by the id each was joined as: a
    message goes to a room id, never to an alias, so a set configured with
    ``#team:example.org`` is posted in the room the alias named at the join."""

    def __init__(self) -> None:
        self._ids: dict[str, str] = {}
        # Set at every join: sets that could not be posted (their room would
        # not have the bridge yet) are tried again then, not at their backoff.
        self.news = asyncio.Event()

    def joined(self, room: str, room_id: str) -> None:
        self._ids[room] = room_id
        self.news.set()

    def of(self, room: str) -> str:
        """``room``'s id (itself until joined: posting there fails and is retried)."""
        return self._ids.get(room, room)

    def resolving(self, room_for: Callable[[str], str]) -> Callable[[str], str]:
        """``room_for`` (a set id -> its configured room) giving room ids."""
        return lambda set_id: self.of(room_for(set_id))


# Tries of a room at start, 1 s then 2 s apart, before it is left to the
# asking in the background (``keep_joining``): the homeserver answered the
# login a moment ago, so a room still failing is that room's trouble.
START_TRIES = 3


async def join_rooms(transport: Any, wanted: list[str], stop: asyncio.Event,
                     ids: RoomIds | None = None, asking: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """(room ids joined, rooms that refused for now); ``ids`` learns each room's id.

    ``asking``: rooms that still have open questions.  One the config no
    longer names (its rooms changed, or an alias moved to another room) is
    among the rooms joined when the bridge is still in it: the questions
    there stay open until answered, so their answers must count."""
    joined: list[str] = []
    refused: list[str] = []
    already = await joined_now(transport)
    for room in dict.fromkeys(wanted):
        delay = 1.0
        for attempt in range(1, START_TRIES + 1):
            if stop.is_set():
                break
            try:
                joined.append(await _join(transport, room, already))
                if ids is not None:
                    ids.joined(room, joined[-1])
                break
            except MatrixError as exc:
                if exc.permanent:
                    log.warning("cannot join %s (%s); the other rooms go on, and the bridge keeps asking", room,
                                exc)
                    refused.append(room)
                    break
                problem: Exception = exc
            except Exception as exc:  # noqa: BLE001 - the homeserver busy, a connection cut
                problem = exc
            if attempt == START_TRIES:
                # A room the homeserver keeps failing on (one it deleted answers
                # M_UNKNOWN for ever) held up the start, every other room with
                # it; it is asked for again beside them, like a refused one.
                log.warning("cannot join %s yet (%s); the other rooms go on, and the bridge keeps asking", room,
                            problem)
                refused.append(room)
                break
            log.warning("cannot join %s yet (%s); retrying in %.0f s", room, problem, delay)
            await asyncio.sleep(delay)
            delay *= 2
    for room in asking:
        if room in already and room not in joined:
            log.info("still bridging %s, no longer configured: it has open questions", room)
            joined.append(room)
    return joined, refused


async def joined_now(transport: Any) -> set[str]:
    """The rooms the bridge is in now (after a restart, all of them): at start
    no room is joined again (a join costs the homeserver about what a sync
    does, 12 to 20 ms of Synapse for a small room, while the first sync,
    which brings the answers waiting, is being answered), and an invite into
    one is one sent again.  Empty when it can't be told: every room is then
    joined, and every invite answered, as before."""
    listed = getattr(transport, "joined_rooms", None)
    if listed is None:
        return set()
    try:
        return await listed()
    except Exception as exc:  # noqa: BLE001 - the joins say what is wrong, room by room
        log.info("could not list the rooms joined already (%s); joining each", exc)
        return set()


async def _join(transport: Any, room: str, already: set[str]) -> str:
    """``room`` joined: asked of the homeserver unless it is one of ``already``
    (room ids), whose encryption the transport then learns as a join teaches it."""
    if room not in already:
        return await transport.join(room)
    await transport.room_encrypted(room)
    return room


async def keep_joining(transport: Any, rooms: list[str], stop: asyncio.Event,
                       on_joined: Callable[[str], Awaitable[None]], ids: RoomIds | None = None) -> None:
    """Ask for each room of ``rooms`` again, with backoff, until it is joined."""
    delay = 5.0
    waiting = list(rooms)
    while waiting and not stop.is_set():
        await _sleep_or_stop(stop, delay)
        for room in list(waiting):
            try:
                room_id = await transport.join(room)
            except Exception as exc:  # noqa: BLE001 - asked again later
                log.info("still cannot join %s (%s)", room, exc)
                continue
            waiting.remove(room)
            if ids is not None:
                ids.joined(room, room_id)
            log.info("joined %s at last", room)
            try:
                await on_joined(room_id)
            except Exception:  # noqa: BLE001 - the room is joined; its members are loaded with its first events
                log.exception("setting up %s after joining it failed", room_id)
        delay = min(delay * 2, RETRY_MAX)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    await set_within(stop, seconds)
