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

The homeserver sends an invite once (in one incremental sync, pushed in one
transaction): an answer that fails for now (a 5xx, a cut connection) is
tried again with backoff until the bridge is in, the homeserver refuses for
good, or the invite ends (withdrawn: a leave or ban of the bridge there).
Until answered it is kept in the store with what brought it (``INVITED``),
so a stop in between does not lose it either: the next start answers it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from bridge.service.eventwait import set_within
from bridge.service.transport.matrix import MatrixError
from bridge.service.transport.rooms import RoomIds, configured_rooms

log = logging.getLogger(__name__)

# meta: a room joined at an admin's invite (a direct message for ``!ask``),
# with the admin: bridged again at every start, as a configured room is.
ADMIN_ROOM = "admin_room:"
# meta: + room id -> its inviter ("" when unknown): an invite not answered for
# good yet.  Written in the commit of what brought it (bot mode: the batch
# whose sync token moves past it; appservice mode: the transaction answered
# 200), deleted once answered or ended.
INVITED = "invited:"

# An answer that failed for now is tried again this many seconds later,
# twice as long after each failure, up to ``RETRY_MAX``.
RETRY_FIRST = 2.0
RETRY_MAX = 300.0


def admin_rooms(store: Any, admins: Collection[str]) -> list[str]:
    """The rooms joined at the invite of someone still an admin."""
    return [key[len(ADMIN_ROOM):] for key, inviter in store.meta_with_prefix(ADMIN_ROOM) if inviter in admins]


def welcome_invite(room_id: str, inviter: str | None, rooms: Collection[str],
                   inviters: frozenset[str] | None) -> bool:
    """Only a room of ``rooms``, and only at the invite of someone who may
    answer (anyone, when every member may)."""
    return room_id in rooms and may_invite(inviter, inviters)


def keep_invites(store: Any, invited: Mapping[str, str | None], ended: Collection[str]) -> None:
    """``invited`` kept until answered, ``ended`` forgotten: in the store
    transaction of what brought them, so they are durable before the
    homeserver moves past them."""
    for room in ended:
        store.delete_meta(INVITED + room)
    for room, inviter in invited.items():
        store.set_meta(INVITED + room, inviter or "")


def kept_invites(store: Any) -> dict[str, str | None]:
    """Room id -> inviter of the invites kept and not answered for good."""
    return {key[len(INVITED):]: inviter or None for key, inviter in store.meta_with_prefix(INVITED)}


def membership_news(events: Iterable[Any], user_id: str) -> tuple[dict[str, str | None], list[str]]:
    """Of pushed events: (room id -> inviter, for the rooms ``user_id`` is
    invited to by them; the rooms where its invite ended, a leave or ban of
    it: withdrawn, or its decline).  A room's last such event decides."""
    news: dict[str, str | None | bool] = {}
    for event in events:
        if not (isinstance(event, dict) and event.get("type") == "m.room.member"
                and event.get("state_key") == user_id and isinstance(event.get("room_id"), str)
                and isinstance(event.get("content"), dict)):
            continue
        membership = event["content"].get("membership")
        if membership == "invite":
            sender = event.get("sender")
            news[event["room_id"]] = sender if isinstance(sender, str) else None
        elif membership in ("leave", "ban"):
            news[event["room_id"]] = False
    invited = {room: inviter for room, inviter in news.items() if inviter is not False}
    return invited, [room for room, inviter in news.items() if inviter is False]  # type: ignore[misc]


def may_invite(inviter: str | None, inviters: frozenset[str] | None) -> bool:
    return inviters is None or inviter in inviters


class Invites:
    """The invites of one transport.  ``rooms``: the room ids whose events are
    bridged (the list the transport reads; a room joined is added);
    ``configured``: the config's rooms (ids or aliases); ``asking``: the rooms
    that still have open questions (an invite back into one is welcome
    whatever the config says now, so those questions can be answered).
    ``store``: where invites not answered yet are kept (None: nowhere)."""

    def __init__(self, client: Any, pipeline: Any, rooms: list[str], configured: Collection[str],
                 inviters: frozenset[str] | None, ids: RoomIds | None = None,
                 asking: Callable[[], Collection[str]] = lambda: (), admins: Collection[str] = (),
                 keep_admin_room: Callable[[str, str], Awaitable[Any]] | None = None, store: Any = None):
        self.client = client
        self.pipeline = pipeline
        self.rooms = rooms
        self.configured = configured
        self.inviters = inviters
        self.ids = ids
        self.asking = asking
        self.admins = frozenset(admins)  # may bring the bridge into any room: a direct message for ``!ask``
        self.keep_admin_room = keep_admin_room  # remembers such a room, for the starts after
        self.store = store
        # Called with each room joined at an invite (the first try's, a try again's, a resumed one's).
        self.on_joined: Callable[[str], Any] | None = None
        self._open: dict[str, str | None] = {}  # room id -> inviter, while its invite is being answered
        self._wakes: dict[str, asyncio.Event] = {}  # room id -> set to try it again at once (or to give up)
        self._tasks: set[asyncio.Future[None]] = set()  # the tries again, and the answers a start resumes

    @classmethod
    def of(cls, client: Any, pipeline: Any, rooms: list[str], config: Any, store: Any,
           ids: RoomIds | None) -> "Invites":
        """The invites a transport answers as ``config`` and ``store`` say."""
        return cls(client, pipeline, rooms, configured_rooms(config), config.inviters, ids, store.rooms_with_open,
                   config.admins, lambda room, admin: store.run_written(store.set_meta, ADMIN_ROOM + room, admin),
                   store=store)

    async def answer(self, room_id: str, inviter: str | None) -> None:
        """Join (and learn the members) or decline, once now; an answer that
        failed for now is tried again in the background until it is given."""
        self._open[room_id] = inviter  # (the latest invite's inviter)
        if (wake := self._wakes.get(room_id)) is not None:
            wake.set()  # being answered: tried again at once, as this invite says
            return
        wake = self._wakes[room_id] = asyncio.Event()
        if await self._answered(room_id, inviter, RETRY_FIRST) is None:
            self._spawn(self._again(room_id, wake))

    def ended(self, rooms: Iterable[str]) -> None:
        """The invites to ``rooms`` ended (withdrawn, declined): not tried again."""
        for room in rooms:
            if self._open.pop(room, False) is not False and (wake := self._wakes.get(room)) is not None:
                wake.set()

    async def resume(self) -> None:
        """The invites kept not answered (a stop before their answer went
        through), answered in the background."""
        if self.store is None:
            return
        try:
            kept = await self.store.run(kept_invites, self.store)
        except Exception as exc:  # noqa: BLE001 - still kept: answered at the next start
            log.warning("the invites kept unanswered could not be read (%s)", exc)
            return
        for room, inviter in kept.items():
            if room not in self._wakes:
                self._spawn(self.answer(room, inviter))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _again(self, room_id: str, wake: asyncio.Event) -> None:
        delay = RETRY_FIRST
        while True:
            await set_within(wake, delay)
            wake.clear()
            if room_id not in self._open:
                log.info("the invite to %s ended before the bridge could answer it", room_id)
                self._wakes.pop(room_id, None)
                return
            delay = min(delay * 2, RETRY_MAX)
            if await self._answered(room_id, self._open[room_id], delay) is not None:
                return

    async def _answered(self, room_id: str, inviter: str | None, again_in: float) -> bool | None:
        """One try: whether the bridge joined, once the invite is answered
        for good (joined, declined, or refused for good: then forgotten);
        None when it is worth another try."""
        try:
            joined = await self._answer(room_id, inviter)
        except Exception as exc:  # noqa: BLE001 - a network error, a 5xx: the next try may go through
            if not (isinstance(exc, MatrixError) and exc.permanent):
                log.warning("could not answer the invite to %s yet (%s); trying again in %.0f s", room_id, exc,
                            again_in)
                return None
            log.warning("could not answer the invite to %s (%s); refused for good, not tried again", room_id, exc)
            joined = False
        await self._done(room_id)
        if joined and self.on_joined is not None:
            self.on_joined(room_id)
        return joined

    async def _done(self, room_id: str) -> None:
        self._open.pop(room_id, None)
        self._wakes.pop(room_id, None)
        if self.store is not None:
            try:
                await self.store.run_written(self.store.delete_meta, INVITED + room_id)
            except Exception as exc:  # noqa: BLE001 - kept, it is answered again at the next start: no harm
                log.warning("the invite to %s, answered, is still kept (%s)", room_id, exc)

    async def _answer(self, room_id: str, inviter: str | None) -> bool:
        """Whether the bridge joined (else it declined, or was in already)."""
        unlisted: Exception | None = None
        try:
            joined = await self._rooms_in()
        except Exception as exc:  # noqa: BLE001 - a join needs no list (joining again changes nothing); a decline does
            joined, unlisted = set(), exc
        if room_id in joined:
            # An invite the homeserver sent again (appservice mode, after a
            # restart) into a room the bridge is in: declining would leave it.
            return False
        as_room = welcome_invite(room_id, inviter, [*self.rooms, *self.configured, *self.asking()], self.inviters)
        welcome = as_room or inviter in self.admins
        aliases = await self._aliases_naming(room_id) if may_invite(inviter, self.inviters) else []
        if not (welcome or aliases):
            if unlisted is not None:
                # The bridge may be in the room: a decline then put it out.
                # Answered later, not declined blind.
                raise unlisted
            await self.client.room_leave(room_id)
            log.info("declined an invite to %s from %s: not a configured room or not an answerer",
                     room_id, inviter)
            return False
        # Through the transport: in an encrypted room, what is posted next must go out encrypted.
        room_id = await self.pipeline.transport.join(room_id)
        if room_id not in self.rooms:
            self.rooms.append(room_id)
        self.pipeline.removed.pop(room_id, None)  # in again: cleared now, not only once its join is read
        try:
            if not as_room and not aliases and inviter is not None and self.keep_admin_room is not None:
                # Else, in appservice mode (whose pushes are taken only for
                # the rooms bridged), the next start left it out, and the
                # admin's commands there went unanswered for good.
                await self.keep_admin_room(room_id, inviter)
            await self.pipeline.load_members(room_id)
        except Exception as exc:  # noqa: BLE001 - in the room: answered (a try again would find it joined)
            log.warning("joined %s, but could not set it up (%s); its members are read with its first events",
                        room_id, exc)
        if self.ids is not None:  # its sets are posted here from now on, and at once
            for name in [*aliases, *([room_id] if room_id in self.configured else [])]:
                self.ids.joined(name, room_id)
        log.info("joined %s at the invite of %s", " ".join([*aliases, room_id]), inviter)
        return True

    async def _rooms_in(self) -> set[str]:
        """The rooms the bridge is in now (none when the transport can't
        list them); raises when the listing fails."""
        listed = getattr(self.pipeline.transport, "joined_rooms", None)
        return await listed() if listed is not None else set()

    async def _aliases_naming(self, room_id: str) -> list[str]:
        """The configured aliases that name ``room_id`` now, asked of the room
        directory (an alias that names no room names none; one that can't be
        asked now raises: the invite is answered later, not declined)."""
        naming = []
        for room in self.configured:
            if room.startswith("#"):
                response = await self.client.room_resolve_alias(room)
                found = getattr(response, "room_id", None)
                if found is None and (unknown := MatrixError(f"resolving {room}", response)).transient:
                    raise unknown
                if found == room_id:
                    naming.append(room)
        return naming
