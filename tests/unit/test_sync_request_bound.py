"""A sync of timeout 0 (the start's first, and the polls while the first
posting goes on) is bounded by nio's request_timeout like any request: a
proxy that held it, or a connection dropped without a reset, kept a fresh
bridge from ever posting, ``/health`` not ready and nothing in the log."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from nio import AsyncClient, AsyncClientConfig

from bridge.service.transport.syncbatch import SyncBatch, sync_batch
from helpers.served import served


async def test_a_first_sync_held_by_the_way_there_is_given_up_on_and_asked_again() -> None:
    asked: list[float] = []
    released = asyncio.Event()

    async def held_once(_request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        if len(asked) == 1:
            await released.wait()  # the first request not answered while the bridge waits
        return web.json_response({"next_batch": "s1"})

    async with served([web.get("/_matrix/client/v3/sync", held_once)]) as port:
        client = AsyncClient(f"http://127.0.0.1:{port}", "@bot:hs", config=AsyncClientConfig(request_timeout=1))
        client.access_token = "token"
        try:
            began = time.monotonic()
            batch = await asyncio.wait_for(sync_batch(client, 0, {}, None), 20)
            took = time.monotonic() - began
        finally:
            released.set()
            await client.close()
    assert isinstance(batch, SyncBatch) and batch.next_batch == "s1"
    assert len(asked) == 2 and took < 10, (len(asked), took)
