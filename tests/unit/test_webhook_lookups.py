"""A callback's name whose DNS servers never answer holds the lookups' own
threads only: the bridge's shared threads (file writes, set loading,
matrix-nio's reconnections) stay free, and a check at ``ask`` gives up
within its bound."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import aiohttp

from bridge.agents import callbacks, lookups

HANGING = "never-answers.example"


async def test_lookups_that_hang_leave_the_shared_threads_free_and_the_check_gives_up(monkeypatch):
    released = threading.Event()
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == HANGING:
            released.wait(30)  # a resolver whose servers never answer, until the test ends
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(lookups, "LOOKUP_SECONDS", 0.5)
    try:
        began = time.monotonic()
        checks = [asyncio.ensure_future(callbacks.url_refusal(f"https://{HANGING}/hook/{n}")) for n in range(12)]
        await asyncio.sleep(0.2)
        # Meanwhile the bridge's own work on threads goes on.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "written"), 2) == "written"
        assert await asyncio.gather(*checks) == [None] * 12  # not resolved now: let through, checked at delivery
        assert time.monotonic() - began < 5
        # A delivery's connection to that name: refused within the bound, the shared threads free meanwhile.
        async with aiohttp.ClientSession(connector=callbacks.connector(False, 8)) as http:
            posts = [asyncio.ensure_future(http.post(f"http://{HANGING}/hook", data=b"{}")) for _ in range(8)]
            await asyncio.sleep(0.2)
            assert await asyncio.wait_for(asyncio.to_thread(lambda: "written"), 2) == "written"
            failed = await asyncio.gather(*posts, return_exceptions=True)
        assert all(isinstance(error, aiohttp.ClientError) for error in failed), failed
        assert time.monotonic() - began < 10
    finally:
        released.set()
