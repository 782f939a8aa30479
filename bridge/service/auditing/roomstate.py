"""The checkpoints the rooms hold: the state history of
``dev.superpipeline.answer_log.checkpoint``, read with the bridge's credentials.

For ``verify --room``: every room the bridge is joined to, its timeline read
backwards for that state type only (the homeserver filters), every such
event returned with its sender and state key, whoever sent it and for
whichever log, beside the bridge's own user id.  The caller decides which
to take (``protocol.roomnotes``) and checks them with the log's key: what a
homeserver hands back is never trusted as such.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp

from bridge.protocol.paging import Page, page_of, pages
from bridge.protocol.roomnotes import RoomNote
from bridge.service.auditing.checkpoints import STATE_TYPE

# 100 events a page: the newest 100,000 checkpoints of a room (ten weeks of a
# checkpoint every minute).  Past it the older ones are left, and said so:
# every one read is still checked against the latest.
PAGES_PER_ROOM = 1000


async def read_room_checkpoints(config: Any, on_cut: Callable[[str, int], None] | None = None
                                ) -> tuple[str, list[RoomNote]]:
    """The bridge's user id and the checkpoint events; ``on_cut(room,
    read)``: a room whose history held more than is read."""
    token, as_user = _credentials(config)
    base = config.homeserver.url.rstrip("/") + "/_matrix/client/v3"
    headers = {"Authorization": f"Bearer {token}"}
    extra = {"user_id": as_user} if as_user else {}
    notes: list[RoomNote] = []
    # Each request bounded, not the whole read: many rooms with long histories take long.
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(sock_connect=30,
                                                                                   sock_read=120)) as http:
        user = (await _get(http, f"{base}/account/whoami", extra)).get("user_id", "")
        rooms = (await _get(http, f"{base}/joined_rooms", extra)).get("joined_rooms", [])
        flt = json.dumps({"types": [STATE_TYPE], "lazy_load_members": True})
        for room in rooms:
            url = f"{base}/rooms/{quote(room, safe='')}/messages"

            async def page_from(start: str | None, url: str = url) -> dict[str, Any]:
                params = {"dir": "b", "limit": "100", "filter": flt, **extra}
                if start:
                    params["from"] = start
                return await _get(http, url, params)

            found, whole = await room_checkpoints(room, page_from)
            notes += found
            if not whole and on_cut is not None:
                on_cut(room, len(found))
    return user, notes


async def room_checkpoints(room: str, page_from: Callable[[str | None], Awaitable[dict[str, Any]]]
                           ) -> tuple[list[RoomNote], bool]:
    """``room``'s checkpoint events, newest first, read back from
    ``page_from(token)`` (a ``/messages`` body) by ``paging``'s rule: past
    empty pages (the filter leaves out all but checkpoints, and history
    visibility hides what was said while the bridge was out of the room),
    which once ended the read with checkpoints further back unread.  And
    whether the room's whole history was read."""
    found: list[RoomNote] = []
    gave_up: list[int] = []

    async def fetch(start: str | None) -> Page:
        return page_of(await page_from(start))

    read = 0
    async with contextlib.aclosing(pages(fetch, None, gave_up.append)) as each:
        async for page in each:
            found += _checkpoint_events(room, page.chunk)
            read += 1
            if read >= PAGES_PER_ROOM:
                return found, not page.end
    return found, not gave_up


def _checkpoint_events(room: str, chunk: list[Any]) -> list[RoomNote]:
    found = []
    for event in chunk:
        if not isinstance(event, dict):
            continue
        content = event.get("content")
        if event.get("type") == STATE_TYPE and isinstance(event.get("state_key"), str) \
                and isinstance(content, dict) and isinstance(content.get("checkpoint"), str):
            key = content.get("key") if isinstance(content.get("key"), str) else ""
            found.append(RoomNote(room, str(event.get("sender", "")), event["state_key"], content["checkpoint"], key))
    return found


def _credentials(config: Any) -> tuple[str, str | None]:
    if config.appservice.enabled:
        return config.appservice.as_token, config.bot.user_id
    if config.bot.access_token:
        return config.bot.access_token, None
    from bridge.service.storage.store import Store

    store = Store.read_only(config.store.path, url=config.store.url, password=config.store.password)
    try:
        token = store.get_meta("access_token")
    finally:
        store.close()
    if not token:
        raise ValueError("no access token: set bot.access_token, or run the bridge once to log in")
    return token, None


async def _get(http: aiohttp.ClientSession, url: str, params: dict[str, str]) -> dict[str, Any]:
    async with http.get(url, params=params) as response:
        body = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"{url.rsplit('/v3', 1)[-1]}: {response.status} {body.get('errcode', '')}")
        return body
