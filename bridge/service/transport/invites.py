"""Which invites the bridge takes, and taking them (both transports).

Only a configured room, and only at the invite of someone who may answer:
nobody can pull the bridge, and the questions it posts, into a room of their
choosing.  An admin's invite is taken into any room (a direct message to
give ``!ask`` commands in; nothing is posted there, and an answer there to
a question asked elsewhere is refused as in the wrong room).

A room the config names by its alias (``#team:example.org``) is known by
its id only once joined; an invite into a room the bridge could not join
yet (an invite-only room, a room made after the bridge started) names the
room's id, so the configured aliases are asked of the room directory before
the invite is declined.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from bridge.service.transport.matrix import MatrixError
from bridge.service.transport.rooms import RoomIds, configured_rooms, joined_now

log = logging.getLogger(__name__)

# meta: a room joined at an admin's invite (a direct message for ``!ask``),
# with the admin: bridged again at every start, as a configured room is.
ADMIN_ROOM = "admin_room:"

# An invite whose answer failed for now (the homeserver restarting, its
# proxy's 502) is answered again after each of these waits (``patiently``):
# in appservice mode nothing brings it again, as the homeserver pushed it
# once and there is no sync to show it.
AGAIN_AFTER = (1.0, 2.0, 5.0, 15.0, 30.0, 60.0, 120.0)


def admin_rooms(store: Any, admins: Collection[str]) -> list[str]:
    """The rooms joined at the invite of someone still an admin."""
    return [key[len(ADMIN_ROOM):] for key, inviter in store.meta_with_prefix(ADMIN_ROOM) if inviter in admins]


def welcome_invite(room_id: str, inviter: str | None, rooms: Collection[str],
                   inviters: frozenset[str] | None) -> bool:
    """Only a room of ``rooms``, and only at the invite of someone who may
    answer (anyone, when every member may)."""
    return room_id in rooms and may_invite(inviter, inviters)


def may_invite(inviter: str | None, inviters: frozenset[str] | None) -> bool:
    return inviters is None or inviter in inviters


class Invites:
    """The invites of one transport.  ``rooms``: the room ids whose events are
    bridged (the list the transport reads; a room joined is added);
    ``configured``: the config's rooms (ids or aliases); ``asking``: the rooms
    that still have open questions (an invite back into one is welcome
    whatever the config says now, so those questions can be answered)."""

    def __init__(self, client: Any, pipeline: Any, rooms: list[str], configured: Collection[str],
                 inviters: frozenset[str] | None, ids: RoomIds | None = None,
                 asking: Callable[[], Collection[str]] = lambda: (), admins: Collection[str] = (),
                 keep_admin_room: Callable[[str, str], Awaitable[Any]] | None = None):
        self.client = client
        self.pipeline = pipeline
        self.rooms = rooms
        self.configured = configured
        self.inviters = inviters
        self.ids = ids
        self.asking = asking
        self.admins = frozenset(admins)  # may bring the bridge into any room: a direct message for ``!ask``
        self.keep_admin_room = keep_admin_room  # remembers such a room, for the starts after
        # Rooms joined at an invite whose taking in (the members read, the
        # room bridged) has not been done yet: the bridge is in them, and an
        # invite answered again must finish, not pass them over as joined.
        self.unfinished: set[str] = set()

    @classmethod
    def of(cls, client: Any, pipeline: Any, rooms: list[str], config: Any, store: Any,
           ids: RoomIds | None) -> "Invites":
        """The invites a transport answers as ``config`` and ``store`` say."""
        return cls(client, pipeline, rooms, configured_rooms(config), config.inviters, ids, store.rooms_with_open,
                   config.admins, lambda room, admin: store.run_written(store.set_meta, ADMIN_ROOM + room, admin))

    async def answer(self, room_id: str, inviter: str | None) -> None:
        """Join (and learn the members) or decline; tried once (bot mode's
        sync awaits it)."""
        await self._answer(room_id, inviter)

    async def patiently(self, room_id: str, inviter: str | None) -> None:
        """``answer``, asked again while it fails for now (appservice mode,
        off the transaction's path)."""
        for wait in (*AGAIN_AFTER, None):
            if await self._answer(room_id, inviter):
                return
            if wait is None:
                break
            await asyncio.sleep(wait)
        log.warning("gave up answering the invite to %s from %s: invite the bridge again", room_id, inviter)

    async def _answer(self, room_id: str, inviter: str | None) -> bool:
        """True once answered, or refused for good; False when it failed for
        now and is worth asking again."""
        try:
            if room_id in await joined_now(self.pipeline.transport) and room_id not in self.unfinished:
                # An invite the homeserver sent again (appservice mode, after a
                # restart) into a room the bridge is in: declining would leave it.
                return True
            as_room = welcome_invite(room_id, inviter, [*self.rooms, *self.configured, *self.asking()], self.inviters)
            welcome = as_room or inviter in self.admins
            aliases = await self._aliases_naming(room_id) if may_invite(inviter, self.inviters) else []
            if welcome or aliases:
                self.unfinished.add(room_id)
                # Through the transport: in an encrypted room, what is posted next must go out encrypted.
                # (Joined already by a try that failed after it: joining again changes nothing.)
                joined = await self.pipeline.transport.join(room_id)
                if not as_room and not aliases and inviter is not None and self.keep_admin_room is not None:
                    # Else, in appservice mode (whose pushes are taken only for
                    # the rooms bridged), the next start left it out, and the
                    # admin's commands there went unanswered for good.
                    await self.keep_admin_room(joined, inviter)
                if joined not in self.rooms:
                    self.rooms.append(joined)
                self.pipeline.removed.pop(joined, None)  # in again: cleared now, not only once its join is read
                await self.pipeline.load_members(joined)
                if self.ids is not None:  # its sets are posted here from now on, and at once
                    for name in [*aliases, *([joined] if joined in self.configured else [])]:
                        self.ids.joined(name, joined)
                self.unfinished.discard(room_id)
                log.info("joined %s at the invite of %s", " ".join([*aliases, joined]), inviter)
            else:
                if await self._in_room_surely(room_id):
                    return True  # (the first look could not list the rooms: leaving would put the bridge out)
                await self.client.room_leave(room_id)
                log.info("declined an invite to %s from %s: not a configured room or not an answerer",
                         room_id, inviter)
            return True
        except Exception as exc:  # noqa: BLE001 - an invite left unanswered joins nothing
            again = not (isinstance(exc, MatrixError) and exc.permanent)
            if not again:
                self.unfinished.discard(room_id)
            log.warning("could not answer the invite to %s (%s)", room_id, exc)
            return not again

    async def _in_room_surely(self, room_id: str) -> bool:
        """Whether the bridge is in ``room_id``, asked again before an invite
        is declined: ``joined_now`` says none when it can't list them, and a
        decline then left a room the bridge was in.  Raises when it can't
        be told, so the invite is answered later, not declined blind."""
        listed = getattr(self.pipeline.transport, "joined_rooms", None)
        return listed is not None and room_id in await listed()

    async def _aliases_naming(self, room_id: str) -> list[str]:
        """The configured aliases that name ``room_id`` now, asked of the room
        directory (an alias that names no room, or can't be asked, names none)."""
        naming = []
        for room in self.configured:
            if room.startswith("#"):
                response = await self.client.room_resolve_alias(room)
                if getattr(response, "room_id", None) == room_id:
                    naming.append(room)
        return naming
