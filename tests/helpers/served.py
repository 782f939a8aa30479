"""An aiohttp application served on a free loopback port for a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from aiohttp import web


@contextlib.asynccontextmanager
async def served(routes: Iterable[Any], port: int = 0) -> AsyncIterator[int]:
    """``routes`` served on 127.0.0.1 (``port``, or one the kernel picks); yields the port."""
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    try:
        await site.start()
        yield site._server.sockets[0].getsockname()[1]
    finally:
        await runner.cleanup()
