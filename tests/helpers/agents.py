"""Agents for the integration tests: a bridge configured with two agents, a
one-question set, a webhook receiver that verifies what it is sent, and a
TCP listener that never answers."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from bridge.agents.webhooks import verify
from bridge.devserver import free_port
from helpers.harness import answer_content

TOKENS = {"planner": "planner-token-0123456789abcdef", "other": "other-token-0123456789abcdef"}
SECRETS = {"planner": "planner-hook-secret-42", "other": "other-hook-secret-42"}



def agents_config(port: int, webhook_urls: dict[str, str] | None = None, **api: Any) -> dict[str, Any]:
    agents = {}
    for name, token in TOKENS.items():
        agents[name] = {"token": token, "webhook_secret": SECRETS[name]}
        if webhook_urls and name in webhook_urls:
            agents[name]["webhook_url"] = webhook_urls[name]
    # The receivers are on loopback: allowed here, refused by default (tests that check the refusal say False).
    return {"metrics": {"enabled": False, "listen": f"127.0.0.1:{port}"}, "agents": agents,
            "agent_api": {"webhook_timeout": "2s", "allow_private_callbacks": True, **api}}


def one_question(set_id: str, qid: str = "branch") -> dict[str, Any]:
    return {
        "askwright": 1, "id": set_id, "title": "Release plan",
        "questions": [{
            "id": qid, "kind": "choice", "title": "Release branch",
            "question": "Which branch should the release be cut from?",
            "why": "The cut decides which fixes ship.",
            "options": [{"id": "main", "label": "The main branch"}, {"id": "stable", "label": "The stable branch"}],
            "guess": {"option": "main", "why": "It is what the last release did.", "confidence": "high"}}],
    }


def auth(agent: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[agent]}"}


def start(bridge, **extra: Any) -> str:
    """Start ``bridge`` with the two agents on a listener of its own; its base URL."""
    port = free_port()
    bridge.extra_config = agents_config(port, **extra)
    bridge.start()
    return f"http://127.0.0.1:{port}"


async def wait_listener(bridge, base: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            bridge.check_alive()
            try:
                async with http.get(base + "/v1/openapi.json") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise AssertionError("the agents' listener did not come up")


def structured(result: Any) -> dict[str, Any]:
    """An MCP tool's structured result, after checking it is no error."""
    assert not result.is_error, result.content[0].text
    return result.structured_content


class Receiver:
    """An HTTP server taking webhooks: each verified against the agent's secret."""

    def __init__(self, secret: str):
        self.secret = secret
        self.status = 200
        self.attempts: list[dict[str, Any]] = []   # every POST, as seen
        self.taken: list[dict[str, Any]] = []      # each key answered 2xx with a good signature, once
        self.ok: list[str] = []                    # the key of every 2xx answer given (duplicates kept)
        self.runner: web.AppRunner | None = None
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self.hook)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        good = verify(self.secret, request.headers.get("X-Askwright-Signature", ""), body, time.time())
        seen = {"key": request.headers.get("Idempotency-Key"), "good": good, "body": json.loads(body)}
        self.attempts.append(seen)
        if not good:
            return web.Response(status=401)
        if self.status >= 300:
            return web.Response(status=self.status)
        if all(t["key"] != seen["key"] for t in self.taken):
            self.taken.append(seen)
        self.ok.append(seen["key"])
        return web.Response(status=200)

    async def wait_for(self, count: int, what: str = "taken", timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = getattr(self, what)
            if len(found) >= count:
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(f"{what}: {len(getattr(self, what))} of {count} webhooks within {timeout} s")

    async def close(self) -> None:
        if self.runner:
            await self.runner.cleanup()


class Silent:
    """A TCP port that accepts connections and never says a word (and counts them)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.server: asyncio.base_events.Server | None = None
        self.connections = 0
        self.held: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/never"

    async def start(self) -> None:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.held.append(writer)
            await asyncio.sleep(3600)

        self.server = await asyncio.start_server(hold, "127.0.0.1", self.port)

    async def close(self) -> None:
        for writer in self.held:
            writer.close()
        if self.server:
            self.server.close()


async def answer(bridge, set_id: str, option: str = "stable") -> str:
    """Alice answers the one question of ``set_id`` (the only set in the room)."""
    found = await bridge.wait_questions(bridge.alice, 1)
    (question,) = found.values()
    assert question["content"]["set"]["id"] == set_id
    return await bridge.alice.send(bridge.room_id, answer_content(question, option_id=option))
