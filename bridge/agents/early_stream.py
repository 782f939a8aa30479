"""A long MCP call's response starts within a second.

MCP clients (the Python SDK's, for one) that have sent a request and see the
connection close before any response headers treat it as a broken transport
and give up the whole client; a response stream that ends early is, for them,
one failed call.  The SDK's 2026-era handler holds its response back for up
to 15 s (to answer a quick error with its own HTTP status), so a restart in
that window cost agents their client.  Here a POST that accepts
``text/event-stream`` and has no response after ``after`` seconds gets one:
200, ``text/event-stream``, a comment line; whatever the application answers
then follows on that stream (a JSON answer as one ``message`` event), which
the transport's specification allows for any request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

EARLY_SECONDS = 1.0
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform"),
                (b"x-accel-buffering", b"no")]


def _accepts_stream(scope: Scope) -> bool:
    return any(name == b"accept" and b"text/event-stream" in value.lower() for name, value in scope["headers"])


def start_early(app: AsgiApp, after: float = EARLY_SECONDS) -> AsgiApp:
    async def early(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "POST" or not _accepts_stream(scope):
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
