"""/mcp given what a well-behaved client seldom sends but any may, and while
the bridge stops: each answered as the protocol says, never a 500 and a
traceback in the bridge's log.  A request that comes after the stop began
is refused as a JSON-RPC error with 503, never handed to the sessions' task
group being taken down; a body nested past the JSON parser and a resumed
stream this server keeps no events for are answered as any other."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp

from bridge.agents.front import AgentsFront
from bridge.agents.sets import AgentSets
from bridge.devserver import free_port
from bridge.service.config import parse_config
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import Store
from helpers.config import GOOD
from helpers.served import served

TOKEN = "planner-token-0123456789"
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "1"}}}
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
           "Content-Type": "application/json"}


@contextlib.asynccontextmanager
async def front_at(tmp_path: Path, sets: Callable[[AgentSets], None] = lambda _sets: None
                   ) -> AsyncIterator[tuple[aiohttp.ClientSession, asyncio.Event]]:
    """The agents' front started on a port of its own; a session to it, and
    the stop.  ``sets``: asks the sets there are before it starts."""
    port = free_port()
    config = parse_config({**GOOD, "agents": {"planner": {"token": TOKEN}},
                           "metrics": {"enabled": False, "listen": f"127.0.0.1:{port}"}}, base_dir=tmp_path, environ={})
    store = Store(tmp_path / "bridge.sqlite")
    front = AgentsFront(config, store, Metrics())
    sets(front.sets)
    stop = asyncio.Event()
    try:
        async with served(front.routes(), port):
            try:
                await front.start(stop)
                async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
                    yield http, stop
            finally:
                stop.set()
                await front.close()
    finally:
        store.close()


async def test_a_request_to_mcp_once_the_bridge_stops_gets_a_503_not_a_500(tmp_path: Path, caplog) -> None:
    async with front_at(tmp_path) as (http, stop):
        async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
            assert response.status == 200
        stop.set()
        await asyncio.sleep(0.3)  # the sessions' task group is gone; the listener is not yet
        with caplog.at_level(logging.ERROR):
            async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
                status, body = response.status, await response.json()
    assert status == 503 and "stopping" in body["error"]["message"], (status, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_deep_body_and_a_resumed_stream_are_answered_without_a_server_error(tmp_path: Path, caplog) -> None:
    # A 6 KB body 3,000 arrays deep: a RecursionError out of the bridge's
    # look at the request, a 500 and a traceback at ERROR for any agent to
    # send.  A GET with Last-Event-ID on a live session: the SDK, with no
    # events kept to replay, answered nothing, and the bridge said 500.
    caplog.set_level(logging.ERROR)
    async with front_at(tmp_path) as (http, _stop):
        deep = b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"x": ' + b"[" * 3000 + b"]" * 3000 + b"}}"
        async with http.post("/mcp", data=deep, headers=HEADERS) as response:
            assert response.status < 500, (response.status, await response.text())
        async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
            assert response.status == 200
            session = response.headers["Mcp-Session-Id"]
        resumed = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25",
                   "Accept": "text/event-stream", "Last-Event-ID": "abc"}
        async with http.get("/mcp", headers=resumed, timeout=aiohttp.ClientTimeout(sock_read=2)) as response:
            assert response.status == 200, (response.status, await response.text())
            assert response.headers["Content-Type"].startswith("text/event-stream")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_what_the_headers_refuse_at_mcp_is_said_before_the_body_is_sent(tmp_path: Path) -> None:
    """``Expect: 100-continue`` at /mcp was always "100 Continue": a client
    sent its body (up to 43 MB) to be told then that its token was wrong,
    that it gave two, that the body was too large, that the bridge was
    stopping (and an Expect it does not meet was aiohttp's plain text).  Each is now the JSON-RPC error it gets after the body, before
    any of it, with Connection: close; a request let in still goes through."""
    import json

    from helpers.expect import Asked

    good = [(name, value) for name, value in HEADERS.items()]
    wrong = [("Authorization", "Bearer wrong-token-0123456789"), *good[1:]]
    twice = [("Authorization", "Bearer other-token-0123456789"), *good]
    async with front_at(tmp_path) as (http, stop):
        port = http._base_url.port
        for headers, length, status, expect in ((wrong, 4096, 401, "100-continue"), (twice, 4096, 400, "100-continue"),
                                                (good, 50 * 1024 * 1024, 413, "100-continue"),
                                                (good, 4096, 417, "something-else")):
            async with Asked(port, "POST", "/mcp", headers, length, expect) as asked:
                got, got_headers, body = await asked.answer()
                assert got == status, (got, body)  # not "100 Continue"
                assert json.loads(body)["error"]["message"] and got_headers.get("Connection") == "close", body
        data = json.dumps(INITIALIZE).encode()
        async with Asked(port, "POST", "/mcp", good, len(data)) as asked:
            assert (await asked.answer())[0] == 100
            asked.writer.write(data)
            status, _headers, body = await asked.answer()
            assert status == 200, body
        stop.set()
        await asyncio.sleep(0.3)
        async with Asked(port, "POST", "/mcp", good, 4096) as asked:
            got, _headers, body = await asked.answer()
            assert got == 503 and "stopping" in json.loads(body)["error"]["message"], (got, body)


async def test_the_door_while_the_bridge_starts_says_so_before_a_body_is_sent(tmp_path: Path) -> None:
    """While the bridge starts, /v1 and /mcp are 503 whatever is asked: a
    client asking before its body was told "100 Continue" and sent it first."""
    import json

    from helpers.expect import Asked

    config = parse_config({**GOOD, "agents": {"planner": {"token": TOKEN}}}, base_dir=tmp_path, environ={})
    store = Store(tmp_path / "bridge.sqlite")
    try:
        front = AgentsFront(config, store, Metrics())
        async with served(front.starting_routes()) as port:
            for path in ("/v1/sets/plan", "/mcp"):
                async with Asked(port, "PUT" if path != "/mcp" else "POST", path,
                                 list(HEADERS.items()), 5 * 1024 * 1024) as asked:
                    got, headers, body = await asked.answer()
                    assert got == 503 and headers.get("Retry-After") == "5", (path, got, body)
                    assert json.loads(body) and headers.get("Connection") == "close", (path, body)
    finally:
        store.close()
