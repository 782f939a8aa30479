"""Who was a member of a room at an event, as the timeline places it.

The members the pipeline reads (at start, at a join) are the room's then,
ahead of what the bridge reads next when it was down: someone who answered
and then left meanwhile is no member by them, yet was one when they
answered (a room's events are sent by its joined members; the bridge
running would have taken the answer).  Before a batch is judged, such a
sender is asked after at the event itself (the transport's
``event_context``: ``/context``, the sender's membership there), the
batch's own membership events before it taken into account as judging
will.  An event the homeserver does not have as it came (a forged push,
also one reusing a real event's id) was sent by no member.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from bridge.service.encryption.marks import DEVICE

EventContext = Callable[[str, str], Awaitable[dict[str, Any] | None]]  # (room id, event id) -> /context
ENCRYPTED = "m.room.encrypted"

READS_AT_ONCE = 8  # senders asked after at once
KEPT = 4096  # events remembered (a file's event is judged after its batch, when the file is in)


class MembersThen:
    def __init__(self, own_user: Callable[[str], bool]):
        self.own_user = own_user
        self._joined_at: OrderedDict[str, None] = OrderedDict()  # the newest kept

    def __contains__(self, event_id: object) -> bool:
        """Whether the sender of ``event_id`` was found a member at it, though not by the members read last."""
        return event_id in self._joined_at

    def __len__(self) -> int:
        return len(self._joined_at)

    async def ask_after(self, events: list[dict[str, Any]], members: dict[str, set[str]],
                        event_context: EventContext | None) -> None:
        """The senders of ``events`` that ``members`` (room -> joined) no
        longer hold, asked after at their events (by ``event_context``, the
        transport's: none, nothing is asked)."""
        if event_context is None:
            return
        changed: dict[tuple[str, str], bool] = {}
        doubtful: list[dict[str, Any]] = []
        for event in events:
            room_id, sender, event_id = event.get("room_id"), event.get("sender"), event.get("event_id")
            if not isinstance(room_id, str) or not isinstance(sender, str):
                continue
            content = event.get("content") if isinstance(event.get("content"), dict) else {}
            # A room whose members were never read: the bridge was put out of
            # it before this start (a non-member can't read them), and what
            # was said there before that comes now.  Its senders are asked
            # after too, for what may answer a question (an answer always
            # relates to one): refused for want of members, such an answer
            # stood refused even once the bridge was invited back.
            known = members.get(room_id)
            if (change := member_change(event)) is not None:
                changed[(room_id, change[0])] = change[1]
            elif "state_key" not in event and isinstance(event_id, str) and event_id not in self._joined_at \
                    and (known is not None or "m.relates_to" in content) \
                    and not self.own_user(sender) and not changed.get((room_id, sender), sender in (known or ())):
                doubtful.append(event)
        if not doubtful:
            return
        limit = asyncio.Semaphore(READS_AT_ONCE)

        async def one(event: dict[str, Any]) -> None:
            async with limit:
                if joined_at(await event_context(event["room_id"], event["event_id"]), event):
                    self._joined_at[event["event_id"]] = None

        await asyncio.gather(*(one(event) for event in doubtful))
        while len(self._joined_at) > KEPT:
            self._joined_at.popitem(last=False)


def joined_at(context: dict[str, Any] | None, sent: dict[str, Any]) -> bool:
    """Whether the homeserver's ``context`` of the event ``sent`` came as
    (its ``/context``) shows that very event, sent by a joined member.  Its
    id alone is not that: a push reusing the id of a real event of someone's
    (their join, a message of theirs) would pass as theirs."""
    found = context.get("event") if isinstance(context, dict) else None
    sender = sent.get("sender")
    if not isinstance(found, dict) or found.get("sender") != sender or "state_key" in found \
            or found.get("room_id", sent.get("room_id")) != sent.get("room_id"):
        return False
    if DEVICE in sent:  # decrypted here: the homeserver has the ciphertext
        same = found.get("type") == ENCRYPTED
    else:
        same = found.get("type") == sent.get("type") and found.get("content") == sent.get("content")
    state = context.get("state") if isinstance(context.get("state"), list) else []
    return same and any(isinstance(e, dict) and e.get("type") == "m.room.member" and e.get("state_key") == sender
                        and isinstance(e.get("content"), dict) and e["content"].get("membership") == "join"
                        for e in state)


def member_change(event: dict[str, Any]) -> tuple[str, bool] | None:
    """(whose membership, joined or not) for a room member event, else None."""
    if event.get("type") != "m.room.member" or not isinstance(event.get("state_key"), str):
        return None
    content = event.get("content") if isinstance(event.get("content"), dict) else {}
    return event["state_key"], content.get("membership") == "join"


def is_power_levels(event: dict[str, Any]) -> bool:
    """Whether ``event`` is the room's power levels (whose redactions count)."""
    return event.get("type") == "m.room.power_levels" and event.get("state_key") == ""


def members_over_read(read: set[str], arrived: list[dict[str, Any]]) -> set[str]:
    """The members a read found, with the membership changes judged while
    it was out applied over it, in order: the homeserver may have answered
    the read before them, and the read replaced them (a join lost: each
    answer of hers asked after at its event; a leave lost)."""
    members = set(read)
    for event in arrived:
        if (change := member_change(event)) is not None:
            user, joined = change
            (members.add if joined else members.discard)(user)
    return members
