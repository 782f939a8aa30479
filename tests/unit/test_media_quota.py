"""``agent_api.media_quota``: one agent's uploads cannot fill the disk for
the others.  Served on a real loopback listener, as test_agent_files_http."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import aiohttp
import pytest

from bridge.agents.errors import AgentError
from bridge.agents.http import AgentApi
from bridge.agents.mcp_server import Tools
from bridge.service.config import ConfigError, parse_config
from helpers.config import GOOD
from helpers.served import served
from test_agent_files_http import TOKENS, auth, leftovers, made

MIB = 1024 * 1024
QUOTA = 5 * MIB


@pytest.fixture
async def api(tmp_path: Path):
    raw = {**GOOD, "agents": {name: {"token": token} for name, token in TOKENS.items()},
           "agent_api": {"media_max": 3 * MIB, "media_quota": QUOTA, "rate_per_minute": 10000}}
    agent_api = AgentApi(parse_config(raw, base_dir=tmp_path, environ={}))
    async with served(agent_api.routes()) as port, aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        yield http, agent_api.config.sets.root, agent_api


async def trickled(size: int, pause: float = 0.0):
    """``size`` bytes in pieces, with no Content-Length: counted only as they come."""
    for start in range(0, size, 256 * 1024):
        await asyncio.sleep(pause)
        yield b"q" * min(256 * 1024, size - start)


async def put(http: aiohttp.ClientSession, agent: str, path: str, data) -> tuple[int, dict]:
    async with http.put(f"/v1/sets/{path}", data=data, headers=auth(agent)) as response:
        return response.status, await response.json()


async def test_an_agent_past_its_quota_is_refused_leaving_nothing_and_another_agent_uploads_as_before(api):
    http, root, agent_api = api
    for set_id in ("first", "second"):
        status, _ = await put(http, "planner", f"{set_id}/media/take.mp4", os.urandom(2 * MIB))
        assert status == 201
    # Content-Length says it: refused before a byte is written, and the set id it would have claimed stays free.
    status, body = await put(http, "planner", "third/media/take.mp4", os.urandom(2 * MIB))
    assert status == 413 and body["error"] == "quota_exceeded", body
    assert "agent_api.media_quota" in body["message"] and str(QUOTA) in body["message"]
    assert body["quota"]["limit"] == QUOTA and 4 * MIB <= body["quota"]["used"] < 4 * MIB + 4096
    assert "third" not in made(root)
    # No Content-Length: stopped once the running total passes the quota, nothing left.
    status, body = await put(http, "planner", "first/media/more.mp4", trickled(2 * MIB))
    assert status == 413 and body["error"] == "quota_exceeded", body
    assert sorted(p.name for p in (root / "first").iterdir()) == [".askwright-agent.json", "take.mp4"]
    assert leftovers(root / "first") == []
    # Over MCP: a tool error naming the same, before anything is written.
    with pytest.raises(AgentError) as refused:
        await Tools(agent_api.sets, agent_api.config.agents).call("planner", "upload_media", {
            "set_id": "first", "name": "more.png", "data": base64.b64encode(os.urandom(2 * MIB)).decode()})
    assert refused.value.as_dict()["error"] == "quota_exceeded" and "agent_api.media_quota" in refused.value.message
    assert refused.value.as_dict()["quota"]["limit"] == QUOTA
    assert not (root / "first" / "more.png").exists()
    # A file replaced counts only its difference: 2 MiB in place of 2 MiB fits, 2.5 MiB too (4.5 MiB in all).
    status, body = await put(http, "planner", "first/media/take.mp4", os.urandom(2 * MIB + MIB // 2))
    assert (status, body["created"]) == (200, False), body
    # Another agent is not held by the planner's use: its own 5 MiB go up.
    for set_id in ("elsewhere", "beyond"):
        status, body = await put(http, "other", f"{set_id}/media/clip.mp4", os.urandom(2 * MIB + MIB // 4))
        assert status == 201, body


async def test_uploads_at_once_are_counted_together_and_a_smaller_replacement_always_fits(api):
    """Each of several uploads at once fits the quota alone: the disk, looked
    at as each began, showed none of the others."""
    http, root, _agent_api = api
    results = await asyncio.gather(*(put(http, "planner", f"s{n}/media/clip.mp4", trickled(2 * MIB, 0.01))
                                     for n in range(4)))
    statuses = sorted(status for status, _ in results)
    assert statuses.count(201) == 2 and statuses.count(413) == 2, results
    on_disk = sum(p.stat().st_size for p in root.rglob("*.mp4"))
    assert on_disk == 4 * MIB
    # Past the quota already (the operator lowered it): a file no larger than the one it replaces still fits.
    _http, _root, agent_api = api
    agent_api.sets.media_quota.limit = MIB
    kept = next(p for p in root.rglob("clip.mp4"))
    status, body = await put(http, "planner", f"{kept.parent.name}/media/clip.mp4", os.urandom(MIB))
    assert status == 200, body
    status, body = await put(http, "planner", f"{kept.parent.name}/media/clip.mp4", os.urandom(MIB + 1))
    assert status == 413 and body["error"] == "quota_exceeded"


async def test_files_through_a_symlink_do_not_count_and_a_set_folder_link_is_not_walked(api, tmp_path):
    http, root, _agent_api = api
    status, _ = await put(http, "planner", "mine/media/a.png", os.urandom(MIB))
    assert status == 201
    big = tmp_path / "elsewhere.bin"
    big.write_bytes(bytes(8 * MIB))
    (root / "mine" / "link.png").symlink_to(big)
    (root / "linked").symlink_to(root / "mine")  # the same folder again, by another name
    status, body = await put(http, "planner", "mine/media/b.png", os.urandom(3 * MIB))
    assert status == 201, body  # 4 MiB of the 5


def test_media_quota_is_10_gib_unless_configured(tmp_path):
    from bridge.agents.media_quota import DEFAULT_MEDIA_QUOTA

    assert parse_config(GOOD, base_dir=tmp_path, environ={}).agent_api.media_quota == DEFAULT_MEDIA_QUOTA \
        == 10 * 1024 ** 3
    with pytest.raises(ConfigError, match="agent_api.media_quota"):
        parse_config({**GOOD, "agent_api": {"media_quota": 0}}, base_dir=tmp_path, environ={})
