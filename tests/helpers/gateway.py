"""A gateway in front of the bridge that adds an agent's bearer token, as an
operator's reverse proxy might, for clients that cannot send one (the MCP
conformance suite has no option for a token).  Everything else passes as
sent, Host and Origin included, and responses stream back as they come."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from helpers.agents import free_port

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer"}


class TokenGateway:
    def __init__(self, upstream: str, token: str):
        self.upstream = upstream.rstrip("/")
        self.token = token
        self.port = free_port()
        self.runner: web.AppRunner | None = None
        self.http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                                          auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self.http is not None
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _HOP}
        headers["Authorization"] = f"Bearer {self.token}"
        body = await request.read()
        async with self.http.request(request.method, self.upstream + request.rel_url.raw_path_qs, headers=headers,
                                     data=body or None, allow_redirects=False) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.http is not None:
            await self.http.close()
