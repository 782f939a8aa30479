"""Files people send are downloaded over connections of their own: 110 of
them trickling in from a slow media store took every connection of the
client's pool (aiohttp's 100), and the bridge's syncs and sends waited
behind them (an answer in another room recorded 80 s late)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from aiohttp.test_utils import TestServer
from nio import AsyncClient

from bridge.service.transport.matrix import NioTransport
from bridge.service.transport.mediasession import MEDIA_CONNECTIONS


async def test_slow_downloads_leave_the_clients_own_requests_their_connections():
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"\x89")
        await asyncio.sleep(60)  # the rest never comes within the test
        return response

    async def versions(_request: web.Request) -> web.Response:
        return web.json_response({"versions": ["v1.11"]})

    app = web.Application()
    app.router.add_get("/_matrix/client/v1/media/download/{server}/{media}", trickle)
    app.router.add_get("/_matrix/client/versions", versions)
    server = TestServer(app)
    await server.start_server()
    client = AsyncClient(str(server.make_url("")).rstrip("/"), "@bot:hs")
    client.access_token = "token"
    transport = NioTransport(client)
    started = asyncio.Event()
    begun = 0

    async def one(n: int) -> None:
        nonlocal begun
        async with transport.download(f"mxc://hs/file{n}", stall_seconds=30) as body:
            async for _chunk in body.chunks:
                begun += 1
                if begun == MEDIA_CONNECTIONS:  # (the rest wait for one of those connections, or, before, the client's)
                    started.set()
                await asyncio.sleep(60)

    downloads = [asyncio.create_task(one(n)) for n in range(110)]
    try:
        await asyncio.wait_for(started.wait(), 20)
        await asyncio.sleep(0.5)
        asked = time.monotonic()
        response = await asyncio.wait_for(client.send("GET", "/_matrix/client/versions"), 10)
        assert response.status == 200 and time.monotonic() - asked < 2
    finally:
        for task in downloads:
            task.cancel()
        await asyncio.gather(*downloads, return_exceptions=True)
        await transport.media.close()
        await client.close()
        await server.close()
