"""The agents' HTTP API under /v1/, on the bridge's listener: JSON in and
out, a bearer token per agent, size and rate limits.

Every answer is a JSON object; an error is ``{"ok": false, "error": code,
"message": ...}`` (with ``errors``/``warnings`` on a lint failure).  The
OpenAPI document (``openapi.json`` beside this module, served at
/v1/openapi.json) is the contract: every request is checked against it
(``contract.py``) before its handler runs, and the statuses are the ones it
lists."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import HttpVersion11, web

from bridge.agents.auth import RateLimiter, agent_for, credentials_in
from bridge.agents.callbacks import check_callbacks
from bridge.agents.contract import Checked, Contract, Operation
from bridge.agents.errors import AgentError, LintFailed
from bridge.agents.files_http import FileRoutes
from bridge.agents.bodyread import BodyGate, closing_if_unreadable, paced
from bridge.agents.sets import BIG_DOCUMENT, AgentSets
from bridge.agents.waiting import DEFAULT_TIMEOUT, wait_answers
from bridge.questionset.setdir import MAX_QUESTIONS_BYTES
from bridge.service.config import Config

log = logging.getLogger(__name__)

OPENAPI = Path(__file__).with_name("openapi.json")
# A close request is a few ids and a reason.
MAX_SMALL_BODY = 64 * 1024
# Where a guarded handler finds what the contract read of its request (a
# typed key where aiohttp has them).
CHECKED: Any = web.RequestKey("askwright.checked", Checked) if hasattr(web, "RequestKey") else "askwright.checked"
# The agent a request's ``Expect: 100-continue`` was answered for (its
# request counted against the rate then).
ADMITTED: Any = web.RequestKey("askwright.admitted", str) if hasattr(web, "RequestKey") else "askwright.admitted"

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]
# What refuses a route's request from its headers alone, past the token and
# the contract (raises an AgentError): asked before its body is sent.
BeforeBody = Callable[[web.Request, str], Awaitable[None]]


class AgentApi:
    def __init__(self, config: Config, sets: AgentSets | None = None, log: Any = None):
        self.config = config
        self.log = log  # the answer log's routes (log_routes.LogRoutes), when the bridge has a store
        self.sets = sets or AgentSets(config.sets.root)
        # An agent may start its max_waits long polls at once, and again as they end, without a request of its budget.
        self.limiter = RateLimiter(config.agent_api.rate_per_minute, refunds_per_minute=config.agent_api.max_waits)
        self.document = OPENAPI.read_bytes()
        self.contract = Contract(json.loads(self.document))
        self.bodies = BodyGate()  # big bodies read at once: /v1's (media too) and /mcp's
        self.sets.waits.per_agent = config.agent_api.max_waits
        self.sets.waits.total = config.agent_api.max_waits_total
        self.sets.waits.give_back = self.limiter.give_back
        self.sets.media_quota.limit = config.agent_api.media_quota
        self.files = FileRoutes(self.sets, config.agent_api.media_max, bodies=self.bodies)

    def authenticate(self, request: web.Request) -> str:
        """The agent of the request; a Refusal (400, 401 or 429) otherwise."""
        if credentials_in(request.headers.getall("Authorization", ())) > 1:
            raise Refusal(400, "bad_request", "Authorization: more than one credential (the field is given once, "
                                              "with one bearer token); none of them was taken")
        agent = agent_for(request.headers.get("Authorization"), self.config.agents)
        if agent is None:
            raise _unauthorized()
        if not self.limiter.allow(agent):
            raise Refusal(429, "rate_limited", "too many requests; slow down",
                          headers={"Retry-After": str(self.limiter.retry_after(agent))})
        return agent

    def routes(self) -> web.RouteTableDef:
        routes = web.RouteTableDef()
        routes.get("/v1/openapi.json")(self.openapi)

        def guard(add: Callable[..., Any], path: str, handler: Handler, limit: int = MAX_SMALL_BODY,
                  before_body: BeforeBody | None = None) -> None:
            add(path, expect_handler=self._expect(limit, before_body))(self._guarded(handler, limit))

        guard(routes.get, "/v1/sets", self.list_sets)
        guard(routes.put, "/v1/sets/{id}", self.put_set, MAX_QUESTIONS_BYTES, self._set_not_theirs)
        guard(routes.get, "/v1/sets/{id}/answers", self.answers)
        guard(routes.post, "/v1/sets/{id}/close", self.close, before_body=self._no_set_of_theirs)
        # {name} takes a / or a newline too, so such a name is refused naming it (400), not missed by the router.
        guard(routes.get, "/v1/sets/{id}/attachments/{name:[\\s\\S]+}", self.files.attachment)
        guard(routes.put, "/v1/sets/{id}/media/{name:[\\s\\S]+}", self.files.put_media, self.files.media_max,
              self.files.media_refused)
        if self.log is not None:
            guard(routes.get, "/v1/log/checkpoint", self.log.checkpoint)
            guard(routes.get, "/v1/log/inclusion", self.log.inclusion)
            guard(routes.get, "/v1/log/consistency", self.log.consistency)
            guard(routes.get, "/v1/log/leaves", self.log.leaves)
        # Last: what no route above took (answered before a body, too).
        routes.route("*", "/v1/{tail:[\\s\\S]*}", expect_handler=self._elsewhere_at_once)(self.elsewhere)
        return routes

    async def elsewhere(self, request: web.Request) -> web.Response:
        """No route of the API for this request: 405 naming the methods the
        path has, or 404; in JSON like every answer of the API."""
        allowed: set[str] = set()
        for resource in request.app.router.resources():
            if resource is not request.match_info.route.resource:
                # (A catch-all of another door, the appservice's "*" on every
                # path, names no method of this API: counted, every unknown
                # /v1 path was a 405 with "Allow: *".)
                allowed |= (await resource.resolve(request))[1] - {"*"}
        if allowed:
            return Refusal(405, "method_not_allowed", f"{request.path} takes {', '.join(sorted(allowed))}",
                           headers={"Allow": ", ".join(sorted(allowed))}).response
        return Refusal(404, "not_found", f"no route {request.path} in this API (see /v1/openapi.json)").response

    async def _elsewhere_at_once(self, request: web.Request) -> web.StreamResponse:
        """A request no route takes, answered before its body (it was sent
        "100 Continue", then the 404 or 405 once it had uploaded)."""
        return final_before_body(await self.elsewhere(request))

    def _expect(self, limit: int, before_body: BeforeBody | None = None) -> \
            Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
        """A client asking before it sends its body (``Expect: 100-continue``)
        is answered "100 Continue" only when the request's headers leave
        nothing to refuse it for, as RFC 9110 10.1.1 asks: the token (its
        rate too), the address and query, the body's size, the agent's
        uploads under way, and ``before_body`` (whose set it is, a media
        file's name and quota).  Otherwise it gets the refusal the route
        would give once the body was in: curl, sent "100 Continue" at once,
        sent megabytes only to be refused."""
        async def expect(request: web.Request) -> web.StreamResponse | None:
            if request.version != HttpVersion11:
                return None
            if request.headers.get("Expect", "").lower() != "100-continue":
                # (In the API's shape, as every refusal: aiohttp's own was plain text.)
                return final_before_body(Refusal(
                    417, "expectation_failed", f"Expect: {request.headers.get('Expect', '')[:100]!r} is not one "
                                               "this API meets (only 100-continue)").response)
            try:
                agent = self.authenticate(request)
                request[ADMITTED] = agent  # its request is counted: the handler does not count it again
                op, _checked = self._parameters(request)
                if op.media_types:  # a route that takes a body
                    if request.content_length is not None and request.content_length > limit:
                        raise Refusal(413, "too_large", f"the body is larger than {limit} bytes")
                    self.bodies.take(agent, request.content_length)()  # a place now, or 429 (given back at once)
                if before_body is not None:
                    await before_body(request, agent)
            except Refusal as exc:
                return final_before_body(exc.response)
            except AgentError as exc:
                return final_before_body(_refused(exc))
            except Exception:  # noqa: BLE001 - answered in the API's shape, logged once (_failed)
                return final_before_body(_failed(request))
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # (as aiohttp's own: the response has not begun)
            return None
        return expect

    async def _set_not_theirs(self, request: web.Request, agent: str) -> None:
        """A set's PUT: NotFound when its folder is another's."""
        await asyncio.to_thread(self.sets.not_theirs, agent, request.match_info["id"])

    async def _no_set_of_theirs(self, request: web.Request, agent: str) -> None:
        """A close: NotFound when there is no set of the agent's to close."""
        await asyncio.to_thread(self.sets.set_dir, agent, request.match_info["id"])

    def _guarded(self, handler: Handler, body_limit: int = MAX_SMALL_BODY) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``handler`` behind the token, the rate limit and the contract: it
        runs only for a request its operation in openapi.json allows, and
        finds what the contract read in ``request[CHECKED]``."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                agent = request.get(ADMITTED) or self.authenticate(request)
                request[CHECKED] = await self.check(request, body_limit, agent)
                return await handler(request, agent)
            except Refusal as exc:
                refused = exc.response
            except AgentError as exc:
                refused = _refused(exc)
            except web.HTTPException:
                raise  # an answer aiohttp gives as it is
            except Exception:  # noqa: BLE001 - answered in the API's shape, logged once (_failed)
                refused = _failed(request)
            return closing_if_unreadable(request, refused)
        return guarded

    def _parameters(self, request: web.Request) -> tuple[Operation, Checked]:
        """The request's operation in the document, and its address and query
        as the operation reads them; BadRequest (400) otherwise."""
        # HEAD is GET without the body (aiohttp serves it on every GET route).
        method = "GET" if request.method == "HEAD" else request.method
        op = self.contract.operation(method, request.match_info.route.resource.canonical)
        if op is None:  # a route the document does not describe: the bridge's own mistake
            log.error("%s %s is served but not in openapi.json", request.method, request.match_info.route.resource.canonical)
            raise Refusal(500, "internal_error", "this route is missing from the API's document")
        path, query = self.contract.check_parameters(op, request.match_info, request.query)
        return op, Checked(path, query)

    async def check(self, request: web.Request, body_limit: int, agent: str) -> Checked:
        """The request as its operation in the document reads it; BadRequest (400) or 413 otherwise."""
        op, checked = self._parameters(request)
        if op.takes_json(request.content_type):
            give_back = self.bodies.take(agent, request.content_length)
            try:
                checked.raw = await _body(request, body_limit)
            finally:
                give_back()
            if len(checked.raw) > BIG_DOCUMENT:  # seconds to parse and check: off the loop, in the agent's turn
                checked.body = await self.sets.apart.run(agent, self.contract.check_body, op, checked.raw)
            else:
                checked.body = self.contract.check_body(op, checked.raw)
        return checked

    # -- the routes ------------------------------------------------------------

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.document, content_type="application/json")

    async def list_sets(self, _request: web.Request, agent: str) -> web.Response:
        return web.json_response({"ok": True, "sets": await self.sets.list_sets_apart(agent)})

    async def put_set(self, request: web.Request, agent: str) -> web.Response:
        checked: Checked = request[CHECKED]
        document, callbacks = _envelope(checked.body, checked.raw or b"")
        if callbacks and not self.config.agents[agent].webhook_secret:
            raise LintFailed("callbacks need a webhook_secret for this agent in the bridge's config", findings=[
                {"where": "callbacks", "message": "this agent has no webhook_secret to sign deliveries with"}])
        await check_callbacks(callbacks, allow_private=self.config.agent_api.allow_private_callbacks, agent=agent)
        asked = await self.sets.ask_apart(agent, checked.path["id"], document, callbacks)
        return web.json_response(asked.as_dict(), status=201 if asked.created else 200)

    async def answers(self, request: web.Request, agent: str) -> web.Response:
        checked: Checked = request[CHECKED]
        set_id, query = checked.path["id"], checked.query
        include_all = query.get("all") == "1"
        until = query.get("wait")
        if until is None:  # a plain read (timeout, question and after only mean something with wait)
            view = await self.sets.read_apart(agent, set_id, include_all=include_all)
            return await view_response(await self.files.view(agent, set_id, view))
        waited = await wait_answers(self.sets, agent, set_id, until=until, question=query.get("question"),
                                    timeout=query.get("timeout", DEFAULT_TIMEOUT), include_all=include_all,
                                    after=query.get("after"), gone=lambda: _left(request))
        # Ended by the bridge's stop before its timeout: said as such, so the
        # agent asks again (of the bridge that leads next) rather than taking
        # a timeout that never happened.
        said = "arrived" if waited.arrived else "unanswerable" if waited.unanswerable else \
            "stopping" if self.sets.stopping() else "timeout"
        headers = {"Askwright-Wait": said}
        if waited.unanswerable:
            headers["Askwright-Wait-Reason"] = waited.unanswerable
        return await view_response(await self.files.view(agent, set_id, waited.view), headers=headers)

    async def close(self, request: web.Request, agent: str) -> web.Response:
        checked: Checked = request[CHECKED]
        data = checked.body or {}
        return web.json_response(await self.sets.close_apart(agent, checked.path["id"], data.get("questions"),
                                                             data.get("status", "closed"), data.get("reason")))


# Past this many answers a view is serialized off the event loop: ten waits
# on a set of 24,000 questions returning together took 2.5 s of it.
BIG_VIEW = 1000


async def view_response(view: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    """A read's view as the JSON response ``web.json_response`` makes."""
    if len(view.get("answers") or ()) <= BIG_VIEW:
        return web.json_response(view, headers=headers)
    body = await asyncio.to_thread(lambda: json.dumps(view).encode())
    return web.Response(body=body, content_type="application/json", headers=headers)


class Refusal(Exception):
    """A request turned away before it reaches the service (401, 413, 429)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.response = web.json_response({"ok": False, "error": code, "message": message}, status=status,
                                          headers=headers)




def _refused(exc: AgentError) -> web.Response:
    return web.json_response(exc.as_dict(), status=exc.status, headers=exc.headers or None)


def _failed(request: web.Request) -> web.Response:
    """What no route expected (a bug, a file system error no route names):
    logged here once, with its traceback (counted in ``errors_total``, as
    every error the bridge logs), and answered 500 ``internal_error`` in the
    API's shape, saying nothing of it.  aiohttp answered it in plain text,
    logged under its own name, which nothing counted.  Called in an
    ``except`` block."""
    log.exception("%s %s: the bridge failed on this request", request.method, request.path)
    return Refusal(500, "internal_error", "the bridge failed on this request; its log says why").response


def final_before_body(response: web.StreamResponse) -> web.StreamResponse:
    """A final answer given before the body was asked for, saying the
    connection closes after it (RFC 9110 10.1.1): its client need not send
    the body to use the connection again.  (aiohttp drops what body comes
    anyway for a few seconds before it closes, so the answer is not lost to
    a reset.)"""
    response.force_close()
    return response


def _unauthorized() -> Refusal:
    return Refusal(401, "unauthorized", "a valid bearer token is needed",
                   headers={"WWW-Authenticate": 'Bearer realm="askwright-bridge"'})


async def _body(request: web.Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to be over ``limit``."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, "too_large", f"the body is larger than {limit} bytes")
    chunks, size = [], 0
    async for chunk in paced(request.content.iter_any()):
        size += len(chunk)
        if size > limit:
            raise Refusal(413, "too_large", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _left(request: web.Request) -> bool:
    """Whether the client of a long poll has gone (its connection closed)."""
    return request.transport is None or request.transport.is_closing()


def _envelope(value: Any, raw: bytes) -> tuple[bytes | dict[str, Any], list[str] | None]:
    """A bare questions.json (handed on as its bytes: the service says exactly
    what is wrong with it), or ``{"set": <questions.json>, "callbacks": [...]}``."""
    # Its shape (SetEnvelope, in openapi.json) was checked before the handler ran.
    if isinstance(value, dict) and ("set" in value or "callbacks" in value) and "askwright" not in value:
        return value["set"], value.get("callbacks")
    return raw, None
