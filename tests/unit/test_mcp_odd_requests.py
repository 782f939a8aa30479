"""/mcp given what a well-behaved client seldom sends but any may: a body
nested past the JSON parser, a resumed stream this server keeps no events
for.  Each is answered as the protocol says, never a 500 and a traceback."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp

from bridge.agents.front import AgentsFront
from bridge.devserver import free_port
from bridge.service.config import parse_config
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import Store
from helpers.config import GOOD
from helpers.served import served

TOKEN = "planner-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
           "Content-Type": "application/json"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "1"}}}


async def test_a_deep_body_and_a_resumed_stream_are_answered_without_a_server_error(tmp_path: Path, caplog) -> None:
    # A 6 KB body 3,000 arrays deep: a RecursionError out of the bridge's
    # look at the request, a 500 and a traceback at ERROR for any agent to
    # send.  A GET with Last-Event-ID on a live session: the SDK, with no
    # events kept to replay, answered nothing, and the bridge said 500.
    port = free_port()
    config = parse_config({**GOOD, "agents": {"planner": {"token": TOKEN}},
                           "metrics": {"enabled": False, "listen": f"127.0.0.1:{port}"}}, base_dir=tmp_path, environ={})
    store = Store(tmp_path / "bridge.sqlite")
    front = AgentsFront(config, store, Metrics())
    stop = asyncio.Event()
    caplog.set_level(logging.ERROR)
    async with served(front.routes(), port):
        try:
            await front.start(stop)
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
                deep = b'{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": {"x": ' + b"[" * 3000 + \
                    b"]" * 3000 + b"}}"
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
        finally:
            stop.set()
            await front.close()
    store.close()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
