"""The agents' HTTP API under /v1/, on the bridge's listener: JSON in and
out, a bearer token per agent, size and rate limits.

Every answer is a JSON object; an error is ``{"ok": false, "error": code,
"message": ...}`` (with ``errors``/``warnings`` on a lint failure).  The
statuses are the ones the OpenAPI document (``openapi.json`` beside this
module, served at /v1/openapi.json) lists."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from bridge.agents.auth import RateLimiter, agent_for
from bridge.agents.errors import AgentError, BadRequest, LintFailed
from bridge.agents.files_http import FileRoutes
from bridge.agents.sets import AgentSets
from bridge.agents.waiting import wait_answers
from bridge.answers.arrival import UNTIL_ALL, UNTIL_ANSWERED
from bridge.questionset.setdir import MAX_QUESTIONS_BYTES
from bridge.service.config import Config

log = logging.getLogger(__name__)

OPENAPI = Path(__file__).with_name("openapi.json")
# A close request is a few ids and a reason.
MAX_SMALL_BODY = 64 * 1024
MAX_WAIT_SECONDS = 300.0

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


class AgentApi:
    def __init__(self, config: Config, sets: AgentSets | None = None, log: Any = None):
        self.config = config
        self.log = log  # the answer log's routes (log_routes.LogRoutes), when the bridge has a store
        self.sets = sets or AgentSets(config.sets.root)
        self.limiter = RateLimiter(config.agent_api.rate_per_minute)
        self.files = FileRoutes(self.sets, config.agent_api.media_max)

    def authenticate(self, request: web.Request) -> str:
        """The agent of the request; a Refusal (401 or 429) otherwise."""
        agent = agent_for(request.headers.get("Authorization"), self.config.agents)
        if agent is None:
            raise Refusal(401, "unauthorized", "a valid bearer token is needed",
                          headers={"WWW-Authenticate": 'Bearer realm="askwright-bridge"'})
        if not self.limiter.allow(agent):
            raise Refusal(429, "rate_limited", "too many requests; slow down",
                          headers={"Retry-After": str(self.limiter.retry_after(agent))})
        return agent

    def agent_or_refusal(self, request: web.Request) -> str | web.Response:
        """The agent, or the refusal to send back (for routes outside ``_guarded``)."""
        try:
            return self.authenticate(request)
        except Refusal as exc:
            return exc.response

    def routes(self) -> web.RouteTableDef:
        routes = web.RouteTableDef()
        routes.get("/v1/openapi.json")(self.openapi)
        routes.get("/v1/sets")(self._guarded(self.list_sets))
        routes.put("/v1/sets/{id}")(self._guarded(self.put_set))
        routes.get("/v1/sets/{id}/answers")(self._guarded(self.answers))
        routes.post("/v1/sets/{id}/close")(self._guarded(self.close))
        routes.get("/v1/sets/{id}/attachments/{name}")(self._guarded(self.files.attachment))
        routes.put("/v1/sets/{id}/media/{name}")(self._guarded(self.files.put_media))
        if self.log is not None:
            routes.get("/v1/log/checkpoint")(self._guarded(self.log.checkpoint))
            routes.get("/v1/log/inclusion")(self._guarded(self.log.inclusion))
            routes.get("/v1/log/consistency")(self._guarded(self.log.consistency))
            routes.get("/v1/log/leaves")(self._guarded(self.log.leaves))
        return routes

    def _guarded(self, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request, self.authenticate(request))
            except Refusal as exc:
                return exc.response
            except AgentError as exc:
                return web.json_response(exc.as_dict(), status=exc.status)
        return guarded

    # -- the routes ------------------------------------------------------------

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.Response(body=OPENAPI.read_bytes(), content_type="application/json")

    async def list_sets(self, _request: web.Request, agent: str) -> web.Response:
        return web.json_response({"ok": True, "sets": self.sets.list_sets(agent)})

    async def put_set(self, request: web.Request, agent: str) -> web.Response:
        body = await _body(request, MAX_QUESTIONS_BYTES)
        document, callbacks = _envelope(body)
        if callbacks and not self.config.agents[agent].webhook_secret:
            raise LintFailed("callbacks need a webhook_secret for this agent in the bridge's config", findings=[
                {"where": "callbacks", "message": "this agent has no webhook_secret to sign deliveries with"}])
        asked = self.sets.ask(agent, request.match_info["id"], document, callbacks)
        return web.json_response(asked.as_dict(), status=201 if asked.created else 200)

    async def answers(self, request: web.Request, agent: str) -> web.Response:
        set_id = request.match_info["id"]
        query = request.query
        include_all = _flag(query.get("all"), "all")
        until = query.get("wait")
        if until is None:  # a plain read (timeout and question only mean something with wait)
            view = self.sets.read(agent, set_id, include_all=include_all)
            return web.json_response(await self.files.view(agent, set_id, view))
        if until not in (UNTIL_ANSWERED, UNTIL_ALL):
            raise BadRequest(f"wait must be {UNTIL_ANSWERED} or {UNTIL_ALL}")
        timeout = _seconds(query.get("timeout", "60"))
        view, done = await wait_answers(self.sets, agent, set_id, until=until, question=query.get("question"),
                                        timeout=timeout, include_all=include_all)
        return web.json_response(await self.files.view(agent, set_id, view),
                                 headers={"Askwright-Wait": "arrived" if done else "timeout"})

    async def close(self, request: web.Request, agent: str) -> web.Response:
        body = await _body(request, MAX_SMALL_BODY)
        data = _json_object(body) if body.strip() else {}
        qids = data.get("questions")
        if qids is not None and (not isinstance(qids, list) or not all(isinstance(q, str) for q in qids)):
            raise BadRequest("questions must be a list of question ids")
        status = data.get("status", "closed")
        reason = data.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise BadRequest("reason must be a string")
        if not isinstance(status, str):
            raise BadRequest("status must be closed or withdrawn")
        return web.json_response(self.sets.close(agent, request.match_info["id"], qids, status, reason))


class Refusal(Exception):
    """A request turned away before it reaches the service (401, 413, 429)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.response = web.json_response({"ok": False, "error": code, "message": message}, status=status,
                                          headers=headers)




async def _body(request: web.Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to be over ``limit``."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, "too_large", f"the body is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise Refusal(413, "too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object")
    return value


def _envelope(body: bytes) -> tuple[bytes | dict[str, Any], list[str] | None]:
    """A bare questions.json, or ``{"set": <questions.json>, "callbacks": [...]}``."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body, None  # the service says exactly what is wrong with it
    if isinstance(value, dict) and "set" in value and "askwright" not in value:
        extra = set(value) - {"set", "callbacks"}
        if extra:
            raise BadRequest(f"unknown field {sorted(extra)[0]!r}: send a questions.json, or set and callbacks")
        if not isinstance(value["set"], dict):
            raise BadRequest("set must be a questions.json object")
        callbacks = value.get("callbacks")
        return value["set"], callbacks if callbacks is not None else None
    return body, None


def _flag(value: str | None, name: str) -> bool:
    if value is None or value in ("0", "false"):
        return False
    if value in ("1", "true", ""):
        return True
    raise BadRequest(f"{name} must be 1 or 0")


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise BadRequest("timeout must be a number of seconds") from None
    if seconds != seconds or seconds < 0 or seconds > MAX_WAIT_SECONDS:
        raise BadRequest(f"timeout must be between 0 and {MAX_WAIT_SECONDS:.0f} seconds")
    return seconds
