"""A ``/sync`` response as bot mode uses it: each joined room's timeline
(its events as the homeserver sent them, whether it was cut short and
where), the invites, and the token to go on from.

matrix-nio builds an object for every part of a response and checks each
against its schemas (about 0.4 ms for a sync bringing one answer, which
a bare client spends too, before it shows the answer); the
pipeline takes raw events and the bridge reads nothing else of it.  So
the response is read here, as ``TimelinePage`` reads ``/messages``.  With
encryption on, what nio must see (the device's to-device messages, device
lists and key count) is kept apart for it (``devicenews``), and encrypted
events are decrypted by ``Crypto.screen``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nio import Api, AsyncClient, SyncError
from nio.responses import Response

from bridge.service.encryption.devicenews import device_sync
from bridge.service.transport.matrix import MatrixError


@dataclass
class Timeline:
    events: list[dict[str, Any]]  # oldest first, each with its room_id
    limited: bool = False  # events between the sync's since and these were left out
    prev_batch: str | None = None  # where the left-out part ends (``gap_pages`` reads it)


@dataclass
class SyncBatch(Response):
    next_batch: str = ""
    timelines: dict[str, Timeline] = field(default_factory=dict)  # joined (and just left) rooms, by id
    invites: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # room id -> its invite_state
    left: frozenset[str] = frozenset()  # the rooms the bridge is out of now (kicked, banned)
    # The bridge's device's parts, in the shape nio reads (``devicenews``).
    device: dict[str, Any] = field(default_factory=lambda: _device_parts({}))

    @classmethod
    def from_dict(cls, parsed: Any) -> "SyncBatch | SyncError":
        """A response body as read from the wire (``_send`` hands it over)."""
        if not isinstance(parsed, dict) or not isinstance(parsed.get("next_batch"), str):
            return SyncError.from_dict(parsed if isinstance(parsed, dict) else {})
        rooms = _dict(parsed.get("rooms"))
        timelines = {}
        # A room left (the bridge kicked or banned) brings its last events:
        # the answers sent before, and the removal itself, which the pipeline
        # reports.
        joined = _dict(rooms.get("join"))
        for room_id, room in [*joined.items(), *_dict(rooms.get("leave")).items()]:
            timeline = _dict(_dict(room).get("timeline"))
            prev_batch = timeline.get("prev_batch")
            timelines[room_id] = Timeline(
                [{**event, "room_id": room_id} for event in _list(timeline.get("events")) if isinstance(event, dict)],
                # A room left has its gap filled too: the homeserver shows a
                # member who left what came before the leave, and an answer
                # given there before a kick (the bridge stopped, then more than
                # a timeline of chatter) was lost, unless it was invited back.
                timeline.get("limited") is True,
                prev_batch if isinstance(prev_batch, str) else None)
        invites = {room_id: [event for event in _list(_dict(_dict(room).get("invite_state")).get("events"))
                             if isinstance(event, dict)]
                   for room_id, room in _dict(rooms.get("invite")).items()}
        return cls(next_batch=parsed["next_batch"], timelines=timelines, invites=invites,
                   left=frozenset(_dict(rooms.get("leave"))), device=_device_parts(parsed))

    def joined(self) -> list[str]:
        """The rooms the bridge is in, of those this sync brings."""
        return [room_id for room_id in self.timelines if room_id not in self.left]

    def gaps(self) -> dict[str, str]:
        """Room id -> where its timeline's left-out part ends, for each room whose timeline was cut short."""
        return {room_id: timeline.prev_batch for room_id, timeline in self.timelines.items()
                if timeline.limited and timeline.prev_batch}

    def events(self, leave_out: str | None = None) -> list[dict[str, Any]]:
        """Every room's timeline events, without the messages sent by
        ``leave_out``: its state events stay (power it gave a moderator, whose
        redactions then count; a member it removed), the pipeline notes them
        and judges none."""
        return [event for timeline in self.timelines.values() for event in timeline.events
                if leave_out is None or event.get("sender") != leave_out or "state_key" in event]


async def sync_batch(client: AsyncClient, timeout: int, sync_filter: dict[str, Any],
                     since: str | None) -> SyncBatch:
    """One ``/sync``, read by ``SyncBatch``.  MatrixError when refused."""
    method, path = Api.sync(client.access_token, since=since, timeout=timeout or None, filter=sync_filter)
    # Through nio's request path, as ``AsyncClient.sync`` sends it: its waits
    # on 429 and its retries hold here too, and a long poll is given 15 s
    # more than it asked the homeserver to wait.
    # (A sync of timeout 0, the start's first: nio's own request_timeout, not
    # ``0``, which aiohttp reads as no limit at all: a first sync a proxy held
    # kept the bridge from ever posting, without a word in its log.)
    batch = await client._send(SyncBatch, method, path, timeout=timeout / 1000 + 15 if timeout else None)
    if not isinstance(batch, SyncBatch):
        raise MatrixError("sync", batch)
    return batch


def _device_parts(body: dict[str, Any]) -> dict[str, Any]:
    """The parts of a response body for the bridge's device, as nio reads them."""
    lists = _dict(body.get("device_lists"))
    return device_sync(_list(_dict(body.get("to_device")).get("events")), _list(lists.get("changed")),
                       _list(lists.get("left")), body.get("device_one_time_keys_count"))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
