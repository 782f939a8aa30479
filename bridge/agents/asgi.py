"""Serving an ASGI application (the MCP SDK's streamable HTTP session
manager) from an aiohttp handler, so /mcp shares the bridge's one listener.

Small on purpose: one HTTP request in, the application's response streamed
out as it is sent (server-sent events included).  ``receive`` hands over the
body, then waits until the response is done or the client has gone, which
is what a streaming ASGI application listens for."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web
from starlette.requests import ClientDisconnect

from bridge.agents.bodyread import BodyUnreadable, TooSlow, paced
from bridge.service.eventwait import set_within

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
AsgiApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

class ClientGone(logging.Filter):
    """The SDK logs a client gone halfway through its body (starlette's
    ``ClientDisconnect``) as an error with a traceback; it is the client's
    leaving (the shell has logged it, at info), not the bridge's fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "ClientDisconnect"


logging.getLogger("mcp.server.streamable_http").addFilter(ClientGone())

# How often a streaming response checks that its client is still there.
DISCONNECT_POLL_SECONDS = 1.0
# Hop-by-hop headers aiohttp sets itself.
_SKIPPED = {b"transfer-encoding", b"connection", b"keep-alive"}


def scope_of(request: web.Request, extra: dict[str, Any] | None = None) -> Scope:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode(),
        "query_string": request.query_string.encode(),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        "server": tuple(sock[:2]) if isinstance(sock, tuple) else None,
        "state": {},
    }
    scope.update(extra or {})
    return scope


async def serve_asgi(app: AsgiApp, request: web.Request, extra: dict[str, Any] | None = None,
                     body_read: Callable[[], None] = lambda: None) -> web.StreamResponse:
    """``app`` serving ``request``; ``body_read`` is called once its body is
    in (or will never be), and at the latest when the response is done.
    BodyUnreadable when the body does not decode (the caller answers it: the
    client is still there, waiting for an answer)."""
    finished = asyncio.Event()
    body_done = False
    refused: BodyUnreadable | None = None
    response: web.StreamResponse | None = None
    # Read against the clock: a body that stops coming ends the request (as
    # the client leaving), never holding its connection for ever.
    body = paced(request.content.iter_any())

    async def receive() -> Message:
        nonlocal body_done, refused
        if not body_done:
            try:
                chunk = await anext(body, b"")
            except TooSlow as exc:
                body_done = True
                body_read()
                finished.set()
                if isinstance(exc, BodyUnreadable):
                    # The client still waits: the caller answers it; what the
                    # application would send is dropped.
                    refused = exc
                else:
                    log.info("%s %s: %s", request.method, request.path, exc.message)
                    if request.transport is not None:
                        request.transport.close()
                return {"type": "http.disconnect"}
            if chunk:
                return {"type": "http.request", "body": chunk, "more_body": True}
            body_done = True
            body_read()
            return {"type": "http.request", "body": b"", "more_body": False}
        while not finished.is_set():
            if request.transport is None or request.transport.is_closing():
                break
            await set_within(finished, DISCONNECT_POLL_SECONDS)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal response
        if finished.is_set():
            return  # the response is done, or its client has gone: nothing is left to send to
        try:
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", []):
                    if name.lower() not in _SKIPPED:
                        response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body" and response is not None:
                body = message.get("body", b"")
                if body:
                    await response.write(body)
                if not message.get("more_body", False):
                    await response.write_eof()
                    finished.set()
        except ConnectionError:
            # The client left mid-response (it closed a stream it was done
            # with, or went away): an ordinary end, not the application's fault.
            log.debug("%s %s: the client left before the response was sent", request.method, request.path)
            finished.set()

    try:
        await app(scope_of(request, extra), receive, send)
    except ClientDisconnect:
        # The body stopped coming (``paced``) or its client left while the
        # application read it: an ordinary end, as on the /v1 routes.
        if refused is None:
            log.info("%s %s: the client left before its request was read", request.method, request.path)
    finally:
        finished.set()
        body_read()
    if refused is not None and response is None:
        raise refused
    if response is None:
        return web.json_response({"ok": False, "error": "internal_error", "message": "no response"}, status=500)
    return response
