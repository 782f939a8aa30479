"""Streamable HTTP sessions that outlive the process serving them.

The 2026-07-28 protocol has no sessions: each request carries its own
envelope, so any bridge process answers any request.  The handshake era
(2025-11-25 and before) has ``Mcp-Session-Id``, which the SDK's session
manager keeps in memory only: after a restart, or on a standby taking over,
every client was told "Session not found" and its client object was lost.

Here a session id says for itself that this bridge issued it, to whom: it is
``<nonce>.<mac>``, the MAC keyed with the agent's own token.  A request with
a session id the process does not hold, but whose MAC checks out for the
agent presenting it, gets its session back: a fresh transport under the same
id, already past the handshake, speaking the version the request's
``MCP-Protocol-Version`` names.  What a process kept only in memory is not
brought back: the session's ``resources/subscribe`` subscriptions (the
client subscribes again) and a stream cut by the restart (the client's next
request is answered; an answer that arrived meanwhile is in ``read``).

A session id is honoured only for the agent it was issued to; any other
(or forged) id is "Session not found", exactly as an expired one."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio
from anyio.abc import TaskStatus
from mcp_types import DEFAULT_NEGOTIATED_VERSION, INTERNAL_ERROR, INVALID_REQUEST, ErrorData, JSONRPCError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bridge.service.config import Agent

log = logging.getLogger(__name__)

_MAC_CONTEXT = b"askwright-bridge mcp session\n"
MAX_ENDED_REMEMBERED = 10_000


class SessionIds:
    """Mints and checks session ids: nothing to store, nothing to share
    between processes but the agents' configuration."""

    def __init__(self, agents: Mapping[str, Agent]):
        self.agents = agents

    def _mac(self, agent: str, nonce: str) -> str | None:
        token = self.agents[agent].token if agent in self.agents else None
        if not token:
            return None
        message = _MAC_CONTEXT + agent.encode() + b"\n" + nonce.encode()
        return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()[:32]

    def mint(self, agent: str) -> str:
        nonce = secrets.token_hex(16)
        mac = self._mac(agent, nonce)
        assert mac is not None, "a session is minted for an authenticated agent"
        return f"{nonce}.{mac}"

    def valid(self, session_id: str, agent: str | None) -> bool:
        nonce, dot, mac = session_id.partition(".")
        if agent is None or not dot or len(nonce) != 32:
            return False
        expected = self._mac(agent, nonce)
        return expected is not None and hmac.compare_digest(mac.encode(), expected.encode())


class EndedSessions:
    """Sessions their clients ended (DELETE): they stay ended, also in a
    restarted process or an instance that took over, because the store
    keeps them (when there is one; the latest are also kept in memory)."""

    def __init__(self, store: Any = None):
        self.store = store
        self.recent: OrderedDict[str, None] = OrderedDict()
        self._swept_at = 0  # the store's ms when ended sessions past KEEP_ENDED_MS were last dropped

    async def end(self, session_id: str) -> None:
        self.recent[session_id] = None
        while len(self.recent) > MAX_ENDED_REMEMBERED:
            self.recent.popitem(last=False)
        if self.store is not None:
            await self.store.run(self._keep, session_id)

    def _keep(self, session_id: str) -> None:
        now = self.store.clock.now_ms()
        with self.store.transaction(flush=False):  # lost to a power cut, the session can only be taken up again
            self.store.set_meta(ENDED + session_id, str(now))
            if now - self._swept_at >= SWEEP_EVERY_MS:
                # Each DELETE a client sends (any id its agent's token makes
                # valid) kept a row for good. Past a day, an ended session
                # taken up again harms no one: only its own agent can name it.
                self._swept_at = now
                stale = [key for key, value in self.store.meta_with_prefix(ENDED)
                         if not value.isdigit() or int(value) < now - KEEP_ENDED_MS]
                for key in stale:
                    self.store.delete_meta(key)

    async def ended(self, session_id: str) -> bool:
        if session_id in self.recent:
            return True
        return self.store is not None and await self.store.run(self.store.get_meta, ENDED + session_id) is not None


ENDED = "mcp_session_ended:"  # meta: a session its client ended, the store's ms when it did
# Handshake-era sessions one agent may hold open at once: the SDK's cap
# (10,000) is every agent's together, and one token holder opening sessions
# and never ending them locked every other agent out.
SESSIONS_PER_AGENT = 1000
SESSION_RETRY_AFTER_SECONDS = 60

KEEP_ENDED_MS = 24 * 3600 * 1000
SWEEP_EVERY_MS = 3600 * 1000


class LastingSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, with ids from ``SessionIds`` and a session
    rebuilt for a valid id it does not hold (after a restart or a takeover),
    unless its client ended it.  ``agent_key`` is the ASGI scope key the
    agent of the request is under."""

    def __init__(self, app: Any, ids: SessionIds, agent_key: str, ended: EndedSessions | None = None,
                 **options: Any):
        super().__init__(app, **options)
        self.ids = ids
        self.agent_key = agent_key
        self.ended = ended or EndedSessions()
        self._owner: dict[str, str] = {}  # session id -> its agent
        self._held: dict[str, int] = {}  # agent -> sessions it holds
        self._refusing: set[str] = set()  # agents told they hold their most

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {name: value for name, value in scope["headers"]}
        raw_id = headers.get(MCP_SESSION_ID_HEADER.lower().encode())
        agent = scope.get(self.agent_key)
        if raw_id is None:
            async with self._session_creation_lock:
                within = self._within_share(agent)
                transport = self._open(self.ids.mint(agent), agent) if within and self._has_room() else None
            if not within:
                await self._refuse_own(agent, scope, receive, send)
                return
            if transport is None:
                await _error_response("Too many open sessions", 503, INTERNAL_ERROR)(scope, receive, send)
                return
            await self._serve_opening_request(transport, scope, receive, send)
            return
        session_id = raw_id.decode("latin-1")
        if not self.ids.valid(session_id, agent):
            await _error_response("Session not found", 404)(scope, receive, send)
            return
        transport = self._server_instances.get(session_id)
        if transport is None:
            # An ended session is never held: only an id not held is asked after (the store, only then).
            if await self.ended.ended(session_id):
                await _error_response("Session not found", 404)(scope, receive, send)
                return
            version = headers.get(MCP_PROTOCOL_VERSION_HEADER.lower().encode(), b"").decode("latin-1")
            async with self._session_creation_lock:
                transport = self._server_instances.get(session_id)
                within = transport is not None or self._within_share(agent)
                if transport is None and within and self._has_room():
                    transport = await self._rebuild(session_id, version, agent)
            if not within:
                await self._refuse_own(agent, scope, receive, send)
                return
            if transport is None:
                await _error_response("Too many open sessions", 503, INTERNAL_ERROR)(scope, receive, send)
                return
        await transport.handle_request(scope, receive, send)
        if transport.is_terminated:
            await self.ended.end(session_id)
            await self._discard_session(session_id, transport)

    def _has_room(self) -> bool:
        return self.max_sessions is None or len(self._server_instances) < self.max_sessions

    def _within_share(self, agent: str) -> bool:
        return self._held.get(agent, 0) < SESSIONS_PER_AGENT

    async def _refuse_own(self, agent: str, scope: Scope, receive: Receive, send: Send) -> None:
        """429: this agent holds its share of sessions (the others keep theirs)."""
        if agent not in self._refusing:  # said once while it stays at its most, not at every refusal
            self._refusing.add(agent)
            log.warning("MCP: agent %s holds %d open sessions, its most; new ones are refused until some end "
                        "(DELETE, or idle)", agent, self._held.get(agent, 0))
        body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
            code=INVALID_REQUEST, message=f"this agent holds {SESSIONS_PER_AGENT} open sessions, its most: end some "
                                          "with DELETE, or reuse one", data={"error": "too_many_sessions"}))
        await Response(body.model_dump_json(by_alias=True, exclude_unset=True), status_code=429,
                       media_type="application/json",
                       headers={"Retry-After": str(SESSION_RETRY_AFTER_SECONDS)})(scope, receive, send)

    def _open(self, session_id: str, agent: str) -> StreamableHTTPServerTransport:
        transport = StreamableHTTPServerTransport(
            mcp_session_id=session_id, is_json_response_enabled=self.json_response, event_store=self.event_store,
            security_settings=self.security_settings, retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout)
        self._server_instances[session_id] = transport
        self._owner[session_id] = agent
        self._held[agent] = self._held.get(agent, 0) + 1
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        agent = self._owner.pop(session_id, None)
        if agent is not None:
            self._refusing.discard(agent)
            left = self._held.get(agent, 1) - 1
            if left > 0:
                self._held[agent] = left
            else:
                self._held.pop(agent, None)
        await super()._discard_session(session_id, transport)

    async def _rebuild(self, session_id: str, version: str, agent: str) -> StreamableHTTPServerTransport:
        """The session back, past its handshake, as the client still has it."""
        transport = self._open(session_id, agent)
        negotiated = version if version in HANDSHAKE_PROTOCOL_VERSIONS else DEFAULT_NEGOTIATED_VERSION

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                idle = transport.idle_scope or anyio.CancelScope()
                try:
                    with idle:
                        dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                            read_stream, write_stream, inline_methods=frozenset({"initialize"}))
                        connection = Connection.for_loop(dispatcher, session_id=session_id,
                                                         protocol_version_hint=negotiated)
                        connection.initialized.set()
                        await serve_connection(self.app, dispatcher, connection=connection,
                                               lifespan_state=self._lifespan_state)
                except Exception:  # noqa: BLE001 - one session's trouble ends that session only
                    log.exception("MCP session %s failed", session_id[:8])
                finally:
                    await self._discard_session(session_id, transport)

        assert self._task_group is not None
        await self._task_group.start(run)
        log.info("MCP session %s… taken up again (protocol %s)", session_id[:8], negotiated)
        return transport


def _error_response(message: str, status: int, code: int = INVALID_REQUEST) -> Response:
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return Response(body.model_dump_json(by_alias=True, exclude_unset=True), status_code=status,
                    media_type="application/json")
