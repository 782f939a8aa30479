"""A ``/sync`` response as bot mode uses it: each joined room's timeline
(its events as the homeserver sent them, whether it was cut short and
where), the invites, and the token to go on from.

matrix-nio builds an object for every part of a response and checks each
against its schemas (about 0.4 ms for a sync bringing one answer, which
a bare client spends too, before it shows the answer); the
pipeline takes raw events and the bridge reads nothing else of it.  So
without encryption the response is read here, as ``TimelinePage`` reads
``/messages``; with it, nio's ``SyncResponse`` (which nio needs to see:
keys, to-device messages, decryption) is turned into the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nio import Api, AsyncClient, SyncError, SyncResponse
from nio.responses import Response

from bridge.service.encryption.crypto import event_dict
from bridge.service.transport.matrix import MatrixError


@dataclass
class Timeline:
    events: list[dict[str, Any]]  # oldest first, each with its room_id
    limited: bool = False  # events between the sync's since and these were left out
    prev_batch: str | None = None  # where the left-out part ends (``gap_pages`` reads it)


@dataclass
class SyncBatch(Response):
    next_batch: str = ""
    timelines: dict[str, Timeline] = field(default_factory=dict)  # joined rooms, by id
    invites: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # room id -> its invite_state

    @classmethod
    def from_dict(cls, parsed: Any) -> "SyncBatch | SyncError":
        """A response body as read from the wire (``_send`` hands it over)."""
        if not isinstance(parsed, dict) or not isinstance(parsed.get("next_batch"), str):
            return SyncError.from_dict(parsed if isinstance(parsed, dict) else {})
        rooms = _dict(parsed.get("rooms"))
        timelines = {}
        for room_id, room in _dict(rooms.get("join")).items():
            timeline = _dict(_dict(room).get("timeline"))
            prev_batch = timeline.get("prev_batch")
            timelines[room_id] = Timeline(
                [{**event, "room_id": room_id} for event in _list(timeline.get("events")) if isinstance(event, dict)],
                timeline.get("limited") is True, prev_batch if isinstance(prev_batch, str) else None)
        invites = {room_id: [event for event in _list(_dict(_dict(room).get("invite_state")).get("events"))
                             if isinstance(event, dict)]
                   for room_id, room in _dict(rooms.get("invite")).items()}
        return cls(next_batch=parsed["next_batch"], timelines=timelines, invites=invites)

    @classmethod
    def from_nio(cls, response: SyncResponse) -> "SyncBatch":
        """nio's response (encryption on): its events as nio left them, decrypted where it could."""
        return cls(next_batch=response.next_batch,
                   timelines={room_id: Timeline([event_dict(event, room_id) for event in room.timeline.events],
                                                bool(room.timeline.limited), room.timeline.prev_batch)
                              for room_id, room in response.rooms.join.items()},
                   invites={room_id: [getattr(event, "source", None) or {} for event in info.invite_state]
                            for room_id, info in response.rooms.invite.items()})

    def gaps(self) -> dict[str, str]:
        """Room id -> where its timeline's left-out part ends, for each room whose timeline was cut short."""
        return {room_id: timeline.prev_batch for room_id, timeline in self.timelines.items()
                if timeline.limited and timeline.prev_batch}

    def events(self, leave_out: str | None = None) -> list[dict[str, Any]]:
        """Every room's timeline events, without those sent by ``leave_out``."""
        return [event for timeline in self.timelines.values() for event in timeline.events
                if leave_out is None or event.get("sender") != leave_out]


async def sync_batch(client: AsyncClient, timeout: int, sync_filter: dict[str, Any], since: str | None,
                     nio_reads: bool = False) -> SyncBatch:
    """One ``/sync``, read by ``SyncBatch`` (by nio when ``nio_reads``: its
    encryption must see every response).  MatrixError when refused."""
    if nio_reads:
        response = await client.sync(timeout=timeout, sync_filter=sync_filter, since=since)
        if not isinstance(response, SyncResponse):
            raise MatrixError("sync", response)
        return SyncBatch.from_nio(response)
    method, path = Api.sync(client.access_token, since=since, timeout=timeout or None, filter=sync_filter)
    # Through nio's request path, as ``AsyncClient.sync`` sends it: its waits
    # on 429 and its retries hold here too, and a long poll is given 15 s
    # more than it asked the homeserver to wait.
    batch = await client._send(SyncBatch, method, path, timeout=timeout / 1000 + 15 if timeout else timeout)
    if not isinstance(batch, SyncBatch):
        raise MatrixError("sync", batch)
    return batch


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
