"""Bot mode: the bridge as an ordinary Matrix user on a sync loop.

The sync token is advanced only inside the pipeline's final commit, after
every answer of the batch is durable, so a crash replays the batch and the
processed-event table makes the replay change nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nio import AsyncClient, LoginResponse, MessageDirection, RoomMessagesResponse, SyncResponse, WhoamiResponse

from bridge.service.config import Config
from bridge.service.matrix import MatrixError, client_config
from bridge.service.store import Store

log = logging.getLogger(__name__)

SYNC_TOKEN = "sync_token"
# A generous timeline per room so a short outage needs no back-fill; longer
# ones are filled from prev_batch (see ``_fill_gap``).
SYNC_FILTER: dict[str, Any] = {
    "room": {"timeline": {"limit": 200}, "state": {"lazy_load_members": False},
             "account_data": {"not_types": ["*"]}, "ephemeral": {"not_types": ["*"]}},
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
}


async def login(config: Config, store: Store) -> AsyncClient:
    """A client logged in as the bot: with the configured token, or with the
    password once, keeping the device and its token in the store."""
    client = AsyncClient(config.homeserver.url, config.bot.user_id, config=client_config())
    token = config.bot.access_token or store.get_meta("access_token")
    if token:
        client.access_token = token
        whoami = await client.whoami()
        if isinstance(whoami, WhoamiResponse):
            client.user_id = whoami.user_id
            client.device_id = whoami.device_id or store.get_meta("device_id") or ""
            return client
        if config.bot.access_token:
            await client.close()
            raise MatrixError("the configured access token was refused", whoami)
    if not config.bot.password:
        await client.close()
        raise MatrixError("no usable credentials (set bot.access_token or bot.password)", None)
    client.device_id = store.get_meta("device_id") or ""
    response = await client.login(config.bot.password, device_name=config.bot.device_name)
    if not isinstance(response, LoginResponse):
        await client.close()
        raise MatrixError("logging in with bot.password", response)
    with store.transaction():
        store.set_meta("access_token", response.access_token)
        store.set_meta("device_id", response.device_id)
    return client


async def prime_sync_token(client: AsyncClient, store: Store) -> None:
    """A new bridge takes its first sync token before it posts anything, so
    every answer to its questions comes after the token and is caught up on
    (history older than the bridge is not its business)."""
    if store.get_meta(SYNC_TOKEN) is not None:
        return
    minimal = {"room": {"timeline": {"limit": 1}}, "presence": {"not_types": ["*"]}}
    while True:
        response = await client.sync(timeout=0, sync_filter=minimal)
        if isinstance(response, SyncResponse):
            break
        log.warning("first sync failed (%s); retrying", getattr(response, "message", response))
        await asyncio.sleep(1)
    with store.transaction():
        store.set_meta(SYNC_TOKEN, response.next_batch)


def batch_events(response: SyncResponse) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for room_id, room in response.rooms.join.items():
        for event in room.timeline.events:
            events.append({**event.source, "room_id": room_id})
    return events


async def fill_gaps(client: AsyncClient, response: SyncResponse, since: str | None) -> list[dict[str, Any]]:
    """Events a limited sync skipped, oldest first, fetched back to ``since``."""
    if since is None:
        return []  # the first sync of a new bridge has no past to catch up on
    missing: list[dict[str, Any]] = []
    for room_id, room in response.rooms.join.items():
        if not room.timeline.limited or not room.timeline.prev_batch:
            continue
        older: list[dict[str, Any]] = []
        start = room.timeline.prev_batch
        while True:
            page = await client.room_messages(room_id, start=start, end=since, direction=MessageDirection.back,
                                              limit=500)
            if not isinstance(page, RoomMessagesResponse):
                raise MatrixError(f"back-filling {room_id}", page)
            older.extend({**event.source, "room_id": room_id} for event in page.chunk)
            if not page.chunk or not page.end or page.end == start:
                break
            start = page.end
        log.info("filled a gap of %d events in %s", len(older), room_id)
        missing.extend(reversed(older))
    return missing


class SyncLoop:
    def __init__(self, client: AsyncClient, store: Store, pipeline: Any, stop: asyncio.Event,
                 on_synced: Any = None):
        self.client = client
        self.store = store
        self.pipeline = pipeline
        self.stop = stop
        self.on_synced = on_synced

    async def run(self) -> None:
        notices = Notifier(self.pipeline, self.stop)
        notifier = asyncio.ensure_future(notices.run())
        try:
            await self._loop(notices)
        finally:
            notices.wake()
            await notifier

    async def _loop(self, notices: "Notifier") -> None:
        backoff = 0.5
        while not self.stop.is_set():
            since = self.store.get_meta(SYNC_TOKEN)
            sync = asyncio.ensure_future(self.client.sync(timeout=30000, sync_filter=SYNC_FILTER, since=since))
            stopper = asyncio.ensure_future(self.stop.wait())
            done, _ = await asyncio.wait({sync, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if sync not in done:
                sync.cancel()  # nothing of this sync was handled: it is simply asked again next start
                break
            try:
                response = sync.result()
                if not isinstance(response, SyncResponse):
                    raise MatrixError("sync", response)
                events = await fill_gaps(self.client, response, since) + batch_events(response)
                token = response.next_batch
                # Files people sent are fetched first: judging runs in one store
                # transaction and does no network I/O.
                await self.pipeline.prepare(events)
                # Runs to completion even when a stop is asked for mid-batch.
                self.pipeline.process(events, commit=lambda: self.store.set_meta(SYNC_TOKEN, token))
                if self.on_synced:
                    self.on_synced()
                notices.wake()
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one failure
                log.warning("sync batch not handled (%s); retrying in %.1f s", exc, backoff)
                await _sleep_or_stop(self.stop, backoff)
                backoff = min(backoff * 2, 30)


class Notifier:
    """Sends the pending notices in the background, so telling people about
    one batch never delays receiving the next."""

    def __init__(self, pipeline: Any, stop: asyncio.Event):
        self.pipeline = pipeline
        self.stop = stop
        self.pending = asyncio.Event()

    def wake(self) -> None:
        self.pending.set()

    async def run(self) -> None:
        backoff = 0.5
        while True:
            await self.pending.wait()
            self.pending.clear()
            try:
                await self.pipeline.send_notices()
                backoff = 0.5
            except Exception as exc:  # noqa: BLE001 - unsent notices stay in the store for the next pass
                log.warning("notices not sent yet (%s); retrying in %.1f s", exc, backoff)
                await _sleep_or_stop(self.stop, backoff)
                backoff = min(backoff * 2, 30)
                self.pending.set()
            if self.stop.is_set():
                return


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass
