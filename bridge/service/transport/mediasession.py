"""The homeserver's media, downloaded over connections of their own.

Files people send came through the client's session, whose pool (aiohttp's
100 connections) the syncs, the sends and the key queries share: 110 files
trickling in from a slow media store held every room's answers 80 s, the
bridge's sync waiting for a connection behind them.  Media has a pool of its
own (``MEDIA_CONNECTIONS``): a slow file waits for its turn among files,
never in front of a sync.
"""

from __future__ import annotations

from typing import Any

import aiohttp

MEDIA_CONNECTIONS = 32


class MediaSession:
    def __init__(self, client: Any):
        self.client = client  # nio's AsyncClient: its homeserver, TLS and proxy settings
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self.client.proxy:
                from aiohttp_socks import ProxyConnector  # as nio reaches the homeserver through one

                connector: aiohttp.BaseConnector = ProxyConnector.from_url(self.client.proxy, limit=MEDIA_CONNECTIONS)
            else:
                connector = aiohttp.TCPConnector(limit=MEDIA_CONNECTIONS)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def get(self, path: str, *, headers: dict[str, str], timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        return await self._open().get(self.client.homeserver + path, ssl=self.client.ssl, headers=headers,
                                      timeout=timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
