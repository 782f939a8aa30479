"""A long MCP call's response starts within a second.

MCP clients (the Python SDK's, for one) that have sent a request and see the
connection close before any response headers treat it as a broken transport
and give up the whole client; a response stream that ends early is, for them,
one failed call.  The SDK's 2026-era handler holds its response back for up
to 15 s (to answer a quick error with its own HTTP status), so a restart in
that window cost agents their client.  Here a POST that accepts
an event stream and has no response after ``after`` seconds gets one:
200, ``text/event-stream``, a comment line; whatever the application answers
then follows on that stream (a JSON answer as one ``message`` event), which
the transport's specification allows for any request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, AsyncContextManager

from bridge.agents import mcp_envelope

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EARLY_SECONDS = 1.0
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                (b"x-accel-buffering", b"no")]


_STREAM_RANGES = frozenset({"text/event-stream", "text/*", "*/*"})


def _accepts_stream(scope: Scope) -> bool:
    """Whether the client's Accept takes an event stream, as the SDK reads it
    (``*/*`` and ``text/*`` do), and not refused by ``q=0``."""
    for name, value in scope["headers"]:
        if name != b"accept":
            continue
        for media_range in value.decode("latin-1").lower().split(","):
            kind, *params = (part.strip() for part in media_range.split(";"))
            if kind in _STREAM_RANGES and not any(_refuses(param) for param in params):
                return True
    return False


def _refuses(param: str) -> bool:
    name, _, weight = param.partition("=")
    if name.strip() != "q":
        return False
    try:
        return float(weight) == 0
    except ValueError:
        return False


# Requests answered whole, never on an early stream: a client reads one
# server-sent event of at most 1 MiB (the Python SDK's default), and a file
# read over MCP (a 20 MB screenshot, 27 MB of base64) that took over a second
# arrived as one such event and failed.  A read takes as long as its file
# does to read, not a restart's 15 s.
WHOLE_METHODS = (b"resources/read",)
_PEEK_AT_MOST = 64 * 1024  # a request of these is small; a bigger body is not one


async def _peek(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's first messages, and its whole body when small enough to
    be read at once (None otherwise); the messages are handed on as they came."""
    taken: list[Message] = []
    body = bytearray()
    while True:
        message = await receive()
        taken.append(message)
        if message["type"] != "http.request":
            return taken, None
        body.extend(message.get("body", b""))
        if not message.get("more_body", False):
            return taken, bytes(body)
        if len(body) > _PEEK_AT_MOST:
            return taken, None


def _replaying(taken: list[Message], receive: Receive) -> Receive:
    async def again() -> Message:
        return taken.pop(0) if taken else await receive()
    return again


def _answered_whole(message: Any) -> bool:
    return isinstance(message, dict) and str(message.get("method", "")).encode() in WHOLE_METHODS


async def _refuse(send: Send, body: bytes) -> None:
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def start_early(app: AsgiApp, after: float = EARLY_SECONDS,
                gate: Callable[[Scope], AsyncContextManager[Any]] | None = None) -> AsgiApp:
    """``gate``: entered around each request answered whole, until its
    response is sent (a file read holds the file several times over until then)."""
    async def early(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST":
            await app(scope, receive, send)
            return
        # The envelope's checks and the file reads' gate hold whatever the
        # client accepts: the SDK serves a POST that takes ``*/*`` as well.
        taken, body = await _peek(receive)
        receive = _replaying(taken, receive)
        message, problem = mcp_envelope.read(body) if body is not None else (None, None)
        if problem is not None:
            await _refuse(send, mcp_envelope.refusal(message, problem))
            return
        if _answered_whole(message):
            async with (gate(scope) if gate is not None else contextlib.nullcontext()):
                await app(scope, receive, send)
            return
        if not _accepts_stream(scope) or (body is not None and not mcp_envelope.is_request(message)):
            # No stream to start early; or a notification or a response, whose
            # answer is a bare 202, never a stream (one started a second in
            # turned the 202 into a 200).
            await app(scope, receive, send)
            return
        lock = asyncio.Lock()
        state = {"app_started": False, "ours": False, "json": False}
        held = bytearray()

        async def start_stream() -> None:
            await asyncio.sleep(after)
            async with lock:
                if state["app_started"]:
                    return
                state["ours"] = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                await send({"type": "http.response.body", "body": b": working on it\n\n", "more_body": True})

        async def relay(message: Message) -> None:
            async with lock:
                if message["type"] == "http.response.start":
                    state["app_started"] = True
                    if state["ours"]:
                        content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                        state["json"] = not content_type.lower().startswith(b"text/event-stream")
                        return
                elif message["type"] == "http.response.body" and state["ours"] and state["json"]:
                    held.extend(message.get("body", b""))
                    if message.get("more_body", False):
                        return
                    # JSON as serialised here has no raw line breaks: one data line.
                    body = bytes(held).replace(b"\r", b"").replace(b"\n", b"")
                    message = {"type": "http.response.body", "body": b"event: message\ndata: " + body + b"\n\n",
                               "more_body": False}
                await send(message)

        timer = asyncio.ensure_future(start_stream())
        try:
            await app(scope, receive, relay)
        finally:
            timer.cancel()

    return early
