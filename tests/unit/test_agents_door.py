"""The agents' HTTP door itself, on a real loopback listener (no homeserver
needed): what it answers from a request's headers, and in what shape."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict

from bridge.agents.http import AgentApi
from bridge.service.config import parse_config
from helpers.agents import one_question
from helpers.config import GOOD
from helpers.served import served

TOKENS = {"planner": "planner-token-0123456789", "other": "other-token-0123456789"}


def auth(agent: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[agent]}"}


@pytest.fixture
async def api(tmp_path: Path):
    raw = {**GOOD, "agents": {name: {"token": token} for name, token in TOKENS.items()},
           "agent_api": {"media_max": 3 * 1024 * 1024, "rate_per_minute": 10000}}
    config = parse_config(raw, base_dir=tmp_path, environ={})
    agent_api = AgentApi(config)
    async with served(agent_api.routes()) as port, aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        yield http, config.sets.root, agent_api


async def test_two_credentials_in_one_request_are_refused_and_authenticate_as_neither(api):
    """Authorization is a singleton field: with two, the first was taken, so
    whoever added the other header (a proxy, a client's default headers
    merged with a call's own) decided which agent the request was."""
    http, root, _ = api
    async with http.put("/v1/sets/plan", json=one_question("plan"), headers=auth("planner")) as response:
        assert response.status == 201, await response.text()
    twice = [CIMultiDict([("Authorization", f"Bearer {TOKENS[first]}"), ("Authorization", f"Bearer {TOKENS[then]}")])
             for first, then in (("planner", "other"), ("other", "planner"), ("planner", "planner"))]
    folded = [{"Authorization": f"Bearer {TOKENS['planner']}, Bearer {TOKENS['other']}"},
              {"Authorization": f"Bearer {TOKENS['other']},Basic cGxhbm5lcjp4"}]
    for headers in [*twice, *folded]:
        async with http.get("/v1/sets/plan/answers", headers=headers) as response:
            body = await response.json()
            assert response.status == 400 and body["error"] == "bad_request", (headers, body)
            assert "Authorization" in body["message"] and "plan" not in body.get("answers", {}), body
        async with http.put("/v1/sets/theirs", json=one_question("theirs"), headers=headers) as response:
            assert response.status == 400, await response.text()
    assert sorted(p.name for p in root.iterdir()) == ["plan"]  # nothing written under either agent
    # One credential is taken as before.
    async with http.get("/v1/sets/plan/answers", headers=auth("planner")) as response:
        assert response.status == 200, await response.text()
