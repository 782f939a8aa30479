"""/mcp while the bridge stops: a request that comes after the stop began is
refused as a JSON-RPC error with 503, never handed to the sessions' task
group being taken down (a 500 and a traceback in the bridge's log)."""

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
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "probe", "version": "1"}}}
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
           "Content-Type": "application/json"}


async def test_a_request_to_mcp_once_the_bridge_stops_gets_a_503_not_a_500(tmp_path: Path, caplog) -> None:
    port = free_port()
    config = parse_config({**GOOD, "agents": {"planner": {"token": TOKEN}},
                           "metrics": {"enabled": False, "listen": f"127.0.0.1:{port}"}}, base_dir=tmp_path, environ={})
    store = Store(tmp_path / "bridge.sqlite")
    front = AgentsFront(config, store, Metrics())
    stop = asyncio.Event()
    async with served(front.routes(), port):
        try:
            await front.start(stop)
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
                async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
                    assert response.status == 200
                stop.set()
                await asyncio.sleep(0.3)  # the sessions' task group is gone; the listener is not yet
                with caplog.at_level(logging.ERROR):
                    async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
                        status, body = response.status, await response.json()
        finally:
            stop.set()
            await front.close()
            store.close()
    assert status == 503 and "stopping" in body["error"]["message"], (status, body)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
