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


async def test_one_agents_names_that_never_answer_leave_another_agents_lookups_and_webhooks_alone(monkeypatch):
    """All lookups shared four threads, and a caller's 5 s counted its time
    queued: one agent's deliveries to a few names whose servers never answer
    held all four, and another agent's lookup of a good name timed out in the
    queue, failed as "no address", and three such opened its circuit."""
    released = threading.Event()
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        if host.startswith("hang"):
            released.wait(30)  # a resolver whose servers never answer, until the test ends
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real("127.0.0.1", port, *args, **kwargs)

    async def agents_deliveries(agent, urls):
        with lookups.on_behalf_of(agent):  # as the deliverer sends each of an agent's webhooks
            async with aiohttp.ClientSession(connector=callbacks.connector(True, 64)) as http:
                async def one(url):
                    async with http.post(url, data=b"{}") as response:
                        return response.status
                return await asyncio.gather(*(one(url) for url in urls), return_exceptions=True)

    from aiohttp import web

    from helpers.served import served

    async def taken(_request):
        return web.Response(status=204)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    routes = web.RouteTableDef()
    routes.post("/hook")(taken)
    try:
        async with served(routes) as port:
            # The planner's webhooks to eight hanging names, many each, and its asks naming more.
            stuck = asyncio.ensure_future(agents_deliveries(
                "planner", [f"http://hang{n % 8}.example/hook/{n}" for n in range(40)]))
            with lookups.on_behalf_of("planner"):
                asks = [asyncio.ensure_future(callbacks.url_refusal(f"https://hang-ask{n}.example/")) for n in range(8)]
            await asyncio.sleep(0.3)
            began = time.monotonic()
            with lookups.on_behalf_of("other"):
                assert await lookups.lookup("good.example", port) != []
            (status,) = await agents_deliveries("other", [f"http://good.example:{port}/hook"])
            took = time.monotonic() - began
            assert status == 204, status
            assert took < 1.0, f"the other agent's lookup and webhook took {took:.1f} s behind the planner's names"
            # A lookup no agent made (the start's check of the config) is not behind the planner's either.
            began = time.monotonic()
            assert "resolves to 127.0.0.1" in await callbacks.url_refusal(f"http://good.example:{port}/hook")
            assert time.monotonic() - began < 1.0
    finally:
        released.set()
    await asyncio.gather(stuck, *asks, return_exceptions=True)


async def test_an_agents_names_that_were_slow_leave_its_own_good_names_room(monkeypatch):
    """Its names whose lookup outlasted the bound go to a thread of their own:
    once known, they no longer hold the threads of the agent's names that answer."""
    real = socket.getaddrinfo

    def resolver(host, port, *args, **kwargs):
        if host.startswith("slow"):
            time.sleep(0.6)  # past the bound below, then given up on
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real("127.0.0.1", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(lookups, "LOOKUP_SECONDS", 0.3)
    names = [f"slow{n}.example" for n in range(4)]
    with lookups.on_behalf_of("slow-names"):
        for pair in (names[:2], names[2:]):  # the agent's two threads, each taking one
            first = await asyncio.gather(*(lookups.lookup(name, 80) for name in pair), return_exceptions=True)
            assert all(isinstance(error, asyncio.TimeoutError) for error in first), first
            await asyncio.sleep(0.5)  # their threads gave up: each name known as slow now
        again = [asyncio.ensure_future(lookups.lookup(name, 80)) for name in names * 3]
        await asyncio.sleep(0.05)
        began = time.monotonic()
        assert await lookups.lookup("good.example", 80) != []
        assert time.monotonic() - began < 0.2
        await asyncio.gather(*again, return_exceptions=True)
