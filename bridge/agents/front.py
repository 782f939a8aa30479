"""Everything agents reach on the bridge's listener, and what runs for them:
the HTTP API under /v1/, MCP's streamable HTTP transport at /mcp, the
watcher that tells subscribed MCP clients of changed answers, and the
webhook deliverer.  ``Operators`` owns one when agents are configured."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.web_protocol import RequestPayloadError
from watchfiles import awatch

from bridge.agents import origin
from bridge.agents.asgi import serve_asgi
from bridge.agents.callbacks import check_configured
from bridge.agents.changes import Changes
from bridge.agents.early_stream import start_early
from bridge.agents.http import ADMITTED, AgentApi, Refusal, final_before_body
from bridge.agents.mcp_files import MCP_MEDIA_MAX, wrapped_base64_size
from bridge.agents.bodyread import STALL_SECONDS, BodyUnreadable, TooManyBodies, closing_if_unreadable
from bridge.agents.mcp_server import GONE_SCOPE_KEY, REFUSED, Subscribers, build_server
from bridge.agents.mcp_sessions import EndedSessions, LastingSessionManager, SessionIds
from bridge.agents.readgate import ReadGate
from bridge.agents.outbox import OutboxHook
from bridge.agents.sets import AgentSets
from bridge.agents.webhooks import STOP_GRACE, Deliverer
from bridge.answers.file import ANSWERS_NAME
from bridge.questionset.setdir import MAX_QUESTIONS_BYTES, QUESTIONS_FILE
from bridge.service.config import Config
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import Store
from bridge.service.storage.storethread import loop_side
from bridge.service.supervisor import Supervisor

log = logging.getLogger(__name__)

AGENT_SCOPE_KEY = "askwright.agent"


def agent_of_http(ctx: Any) -> str | None:
    """The agent /mcp authenticated for this request (put into the ASGI scope)."""
    request = getattr(ctx, "request", None)
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        return scope.get(AGENT_SCOPE_KEY)
    return None


STARTING_RETRY_SECONDS = 5
STARTING = "the bridge is starting; try again in a moment"
# A refused request's id is looked for in a body up to this size.
_ID_LOOKUP_BYTES = 64 * 1024


def mcp_refusal(status: int, message: str, request_id: str | int | None,
                headers: dict[str, str] | None = None) -> web.Response:
    """A JSON-RPC error answering the request, with the HTTP status: what MCP clients show their user."""
    return web.json_response({"jsonrpc": "2.0", "id": request_id, "error": {"code": REFUSED, "message": message}},
                             status=status, headers=headers)


async def _request_id(request: web.Request) -> str | int | None:
    """The JSON-RPC id of a small POSTed request (None when there is none to find)."""
    if request.method != "POST" or (request.content_length or 0) > _ID_LOOKUP_BYTES:
        return None
    try:
        message = json.loads(await asyncio.wait_for(request.content.read(_ID_LOOKUP_BYTES + 1), STALL_SECONDS))
    except (ValueError, RecursionError, UnicodeDecodeError, OSError, asyncio.TimeoutError, RequestPayloadError):
        return None  # (RequestPayloadError: a body that does not decode, or cut short)
    found = message.get("id") if isinstance(message, dict) else None
    return found if isinstance(found, (str, int)) and not isinstance(found, bool) else None


class McpRefused(Exception):
    """An /mcp request refused by its headers: the HTTP status and the words
    of its JSON-RPC error; ``quoting``: the error names the request's id,
    read from a small body."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, quoting: bool = True):
        super().__init__(message)
        self.status, self.message, self.headers, self.quoting = status, message, headers, quoting


class AgentsFront:
    def __init__(self, config: Config, store: Store, metrics: Metrics, supervisor: Supervisor | None = None):
        self.config = config
        self.store = store
        self.supervisor = supervisor or Supervisor()
        self.sets = AgentSets(config.sets.root, posted_revs=store.highest_posted_revs, log_size=store.audit.size,
                              answerers=config.answerers)
        from bridge.agents.log_routes import LogRoutes

        self.log = LogRoutes(store, self.sets)
        self.api = AgentApi(config, self.sets, log=self.log)
        self.reads = ReadGate(AGENT_SCOPE_KEY)  # MCP file reads: a few at a time
        self.subscribers = Subscribers(self.sets.owner_of)
        self.server = build_server(self.sets, config.agents, agent_of_http, self.subscribers,
                                   media_max=config.agent_api.media_max,
                                   allow_private_callbacks=config.agent_api.allow_private_callbacks,
                                   log_store=lambda: store, sign_log=self.log.sign_new_leaves)
        self.manager: LastingSessionManager | None = None
        listen = config.appservice.listen if config.appservice.enabled else config.metrics.listen
        self.served_names = origin.served_names(config.agent_api.public_url, listen)
        self.deliverer = Deliverer(store, config.agents, metrics, drop_after=config.agent_api.drop_after_seconds,
                                   timeout=config.agent_api.timeout_seconds,
                                   allow_private=config.agent_api.allow_private_callbacks)
        # Rows are queued inside the pipeline's batch, a job on the store's thread.
        self.outbox = OutboxHook(store, config.agents, on_queued=loop_side(self.deliverer.wake.set))
        self.tasks: list[asyncio.Future[Any]] = []
        self._webhooks: asyncio.Future[Any] | None = None
        self._ready = asyncio.Event()
        self._posting: set[asyncio.Future[None]] = set()

    @property
    def mcp_body_max(self) -> int:
        """Room for a questions.json, or for a file upload_media takes (base64,
        in lines or not), and the call around it."""
        return max(MAX_QUESTIONS_BYTES, wrapped_base64_size(min(self.config.agent_api.media_max, MCP_MEDIA_MAX))) \
            + 65536

    def starting_routes(self) -> web.RouteTableDef:
        """The agents' door while the bridge starts and only /health is
        served (a homeserver not answering holds the start): 503 in the API's
        own shape, with Retry-After.  Unrouted, /v1 answered aiohttp's
        plain-text 404, which a client took for "no such set"."""
        routes = web.RouteTableDef()
        retry = {"Retry-After": str(STARTING_RETRY_SECONDS)}

        async def v1(_request: web.Request) -> web.Response:
            return Refusal(503, "starting", STARTING, headers=retry).response

        async def mcp(_request: web.Request) -> web.Response:
            return mcp_refusal(503, STARTING, None, retry)

        # Said before a body too: "100 Continue" had a client send it first.
        async def v1_at_once(request: web.Request) -> web.StreamResponse:
            return final_before_body(await v1(request))

        async def mcp_at_once(request: web.Request) -> web.StreamResponse:
            return final_before_body(await mcp(request))

        routes.route("*", "/v1/{tail:[\\s\\S]*}", expect_handler=v1_at_once)(v1)
        routes.route("*", "/mcp", expect_handler=mcp_at_once)(mcp)
        return routes

    def routes(self) -> web.RouteTableDef:
        routes = self.api.routes()
        for method in ("GET", "POST", "DELETE"):
            routes.route(method, "/mcp", expect_handler=self.mcp_expect)(self.mcp)
        return routes

    async def mcp(self, request: web.Request) -> web.StreamResponse:
        return closing_if_unreadable(request, await self._mcp(request))

    async def mcp_expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` at /mcp: "100 Continue" only when the
        headers leave nothing to refuse the request for (its origin, token
        and rate, the bridge starting or stopping, the body's size, the
        agent's big uploads); otherwise the refusal it would get after the
        body, as a JSON-RPC error (its id unknown: the body is not read),
        with ``Connection: close``.  "100 Continue" came at once, and a
        client sent up to 43 MB to be told its token was wrong."""
        if request.version != HttpVersion11:
            return None
        if request.headers.get("Expect", "").lower() != "100-continue":
            expected = request.headers.get("Expect", "")[:100]
            return final_before_body(mcp_refusal(
                417, f"Expect: {expected!r} is not one this server meets (only 100-continue)", None))
        try:
            request[ADMITTED] = self._mcp_admitted(request)
            if request.method == "POST":
                self.api.bodies.take(request[ADMITTED], request.content_length)()  # a place now (given back at once)
        except (McpRefused, TooManyBodies) as exc:
            return final_before_body(mcp_refusal(exc.status, exc.message, None, exc.headers))
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # (as aiohttp's own: the response has not begun)
        return None

    def _mcp_admitted(self, request: web.Request) -> str:
        """The agent of an /mcp request, from its headers alone; McpRefused
        otherwise.  Its rate is counted once (at its Expect, if it asked)."""
        refused = origin.refusal(request.headers.get("Host"), request.headers.get("Origin"), self.served_names)
        if refused is not None:
            status, why = refused
            log.warning("/mcp: %s", why)
            raise McpRefused(status, why)
        try:
            agent = request.get(ADMITTED) or self.api.authenticate(request)
        except Refusal as exc:
            # No WWW-Authenticate: Bearer here.  MCP clients take that as "log in
            # with OAuth" and look for metadata this bridge does not serve; the
            # token is configured, not obtained.
            retry = exc.response.headers.get("Retry-After")
            raise McpRefused(exc.response.status, str(exc), {"Retry-After": retry} if retry else None) from None
        if self.sets.stopping():
            # Its sessions' task group is being taken down: a request handed
            # to it now failed with a 500 and a traceback.
            raise McpRefused(503, "the bridge is stopping; try again in a moment")
        if self.manager is None or not self._ready.is_set():
            raise McpRefused(503, STARTING)
        if (request.content_length or 0) > self.mcp_body_max:
            # Said at once, as /v1 does: never waited for (a body that size
            # would be refused when it had all come, or never comes at all).
            raise McpRefused(413, f"the body is larger than {self.mcp_body_max} bytes (a file larger than "
                                  f"upload_media takes goes to PUT /v1/sets/{{id}}/media/{{name}}, as its bytes)",
                             quoting=False)
        return agent

    async def _mcp(self, request: web.Request) -> web.StreamResponse:
        try:
            agent = self._mcp_admitted(request)
        except McpRefused as exc:
            return mcp_refusal(exc.status, exc.message, await _request_id(request) if exc.quoting else None,
                               exc.headers)
        if "Last-Event-ID" in request.headers:
            # A client resuming a stream: this server keeps no events to
            # replay, and the SDK, asked to, answered nothing (a 500).  The
            # header dropped, the stream opens as a new one, which the
            # protocol lets a server do.
            headers = request.headers.copy()
            headers.popall("Last-Event-ID")
            request = request.clone(headers=headers)
        try:
            body_read = self.api.bodies.take(agent, request.content_length) if request.method == "POST" \
                else (lambda: None)
        except TooManyBodies as exc:
            return mcp_refusal(exc.status, exc.message, None, exc.headers)
        try:
            return await serve_asgi(self._mcp_app, request, {
                AGENT_SCOPE_KEY: agent,
                GONE_SCOPE_KEY: lambda: request.transport is None or request.transport.is_closing()}, body_read)
        except BodyUnreadable as exc:
            log.info("/mcp: %s", exc.message)
            return mcp_refusal(exc.status, exc.message, None)

    @property
    def changes(self) -> Changes:
        """The bridge's "set changed" feed the waits follow (the pipeline and the folder watcher publish to it)."""
        return self.sets.changes

    async def start(self, stop: asyncio.Event, poster: Any = None) -> None:
        # A webhook_url whose name resolves inward stops the start, as any bad config does.
        await check_configured(self.config.agents, allow_private=self.config.agent_api.allow_private_callbacks)
        self.sets.stop = stop  # long polls and MCP waits end when the bridge stops
        self.tasks.append(asyncio.ensure_future(_close_on(stop, self.sets.changes)))
        if poster is not None:
            self.sets.on_written = lambda set_dir: self._post_soon(poster, set_dir)
        # Requests go to the manager running now (a restart of the task makes a new one).
        self._mcp_app = start_early(self._current_manager, gate=self.reads.turn)
        spawn = self.supervisor.spawn
        manager = spawn("mcp", lambda: self._run_manager(stop), stop)
        self.tasks.append(manager)
        self.tasks.append(spawn("answers-watch", lambda: watch_answers(self.config.sets.root, self.subscribers, stop,
                                                                       self.sets.changes),
                                stop))
        self._webhooks = spawn("webhooks", lambda: self.deliverer.run(stop), stop)
        self.tasks.append(self._webhooks)
        await asyncio.wait([asyncio.ensure_future(self._ready.wait()), manager], return_when=asyncio.FIRST_COMPLETED)

    async def _current_manager(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.manager is not None
        await self.manager.handle_request(scope, receive, send)

    def _post_soon(self, poster: Any, set_dir: Path) -> None:
        """The poster takes the set now, as its folder watcher would."""
        async def post() -> None:
            try:
                await poster.sync_changed(self.config.sets.root, [set_dir / QUESTIONS_FILE])
                await self.store.run(self.outbox.owner_written, os.path.realpath(set_dir))
            except Exception:  # noqa: BLE001 - the watcher and the next start take it then
                log.exception("posting %s failed", set_dir.name)

        task = asyncio.ensure_future(post())
        self._posting.add(task)
        task.add_done_callback(self._posting.discard)

    async def _run_manager(self, stop: asyncio.Event) -> None:
        # A manager runs once: a restart after a failure makes a new one.
        self._ready.clear()
        self.manager = LastingSessionManager(self.server, SessionIds(self.config.agents), AGENT_SCOPE_KEY,
                                             EndedSessions(self.store), max_request_body_size=self.mcp_body_max)
        async with self.manager.run():
            self._ready.set()
            try:
                await stop.wait()
            finally:
                self._ready.clear()

    async def close(self) -> None:
        if self._webhooks is not None and self.sets.stopping():
            # Stopping, the deliverer lets its deliveries in flight end (STOP_GRACE): not cut short here.
            await asyncio.wait([self._webhooks], timeout=STOP_GRACE + 1)
        tasks = [*self.tasks, *self._posting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()


async def _close_on(stop: asyncio.Event, changes: Changes) -> None:
    await stop.wait()
    changes.close()


async def watch_answers(root: Path, subscribers: Subscribers, stop: asyncio.Event,
                        feed: Changes | None = None) -> None:
    """Tell the subscribers of a set's answers resource when its answers.json
    changes, and the change feed of every answers.json or questions.json
    written (by the bridge, which tells the feed itself too, or by anyone else:
    without a bridge, as under ``askwright-bridge mcp``, this is the feed's source)."""
    root = Path(root)
    with contextlib.suppress(OSError):
        root.mkdir(parents=True, exist_ok=True)
    names = {ANSWERS_NAME, QUESTIONS_FILE}
    top = str(root)

    def folder_of(path: str) -> str:
        # A set folder itself made, renamed or removed (its files' own
        # changes are not told for a folder renamed away) is its own change.
        return path if os.path.dirname(path) == top else os.path.dirname(path)

    async for changes in awatch(root, stop_event=stop, debounce=100, step=50, recursive=True,
                                watch_filter=lambda _c, path: os.path.basename(path) in names
                                or os.path.dirname(path) == top):
        if feed is not None:
            for folder in {folder_of(path) for _c, path in changes}:
                feed.publish(folder)
        answered = {Path(path).parent.name for _c, path in changes if os.path.basename(path) == ANSWERS_NAME}
        for set_id in sorted(answered):
            try:
                await subscribers.changed(set_id)
            except Exception:  # noqa: BLE001 - a subscriber's trouble never stops the watcher
                log.exception("telling subscribers of %s failed", set_id)
