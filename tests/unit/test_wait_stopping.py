"""An HTTP long poll the bridge's stop cuts short says so (Askwright-Wait:
stopping): it said "timeout" two seconds into a minute's wait, which an agent
can't tell from a wait that ran its course."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from bridge.agents.http import AgentApi
from bridge.agents.mcp_server import Tools
from bridge.service.config import parse_config
from helpers.config import GOOD
from helpers.served import served

TOKEN = "planner-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SET = {"askwright": 1, "id": "plan", "title": "Release plan", "questions": [{
    "id": "branch", "kind": "choice", "title": "Release branch",
    "question": "Which branch should the release be cut from?", "why": "The cut decides which fixes ship.",
    "options": [{"id": "main", "label": "The main branch"}, {"id": "stable", "label": "The stable branch"}],
    "guess": {"option": "main", "why": "It is what the last release did.", "confidence": "high"}}]}


async def test_a_long_poll_the_stop_cuts_short_says_stopping_not_timeout(tmp_path: Path) -> None:
    config = parse_config({**GOOD, "agents": {"planner": {"token": TOKEN}}}, base_dir=tmp_path, environ={})
    api = AgentApi(config)
    stop = asyncio.Event()
    api.sets.stop = stop
    async with served(api.routes()) as port:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
            async with http.put("/v1/sets/plan", json=SET, headers=AUTH) as response:
                assert response.status == 201
            async with http.get("/v1/sets/plan/answers?wait=answered&timeout=0", headers=AUTH) as response:
                assert response.headers["Askwright-Wait"] == "timeout"  # a wait that ran its course

            async def stop_soon() -> None:
                await asyncio.sleep(0.5)
                stop.set()
                api.sets.changes.close()  # as the bridge's stop does

            began = time.monotonic()
            stopping = asyncio.ensure_future(stop_soon())
            async with http.get("/v1/sets/plan/answers?wait=answered&timeout=60", headers=AUTH) as response:
                assert response.status == 200
                assert response.headers["Askwright-Wait"] == "stopping"
            assert time.monotonic() - began < 10
            await stopping
        # The MCP tool says it too (a result, as a timeout's is).
        api.sets.changes.closed = False
        stop.clear()
        stopping = asyncio.ensure_future(stop_soon())
        waited = await Tools(api.sets, config.agents).call("planner", "wait", {"set_id": "plan", "timeout": 60})
        assert (waited["arrived"], waited.get("stopping")) == (False, True)
        await stopping
