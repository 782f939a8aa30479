"""The early stream of a slow MCP call, and the requests answered whole
(an ASGI application of our own behind ``start_early``, called as the
bridge's MCP front calls it)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bridge.agents.early_stream import start_early

SSE = b"text/event-stream"


def _call(method: str, answer_after: float, answer: bytes, gate: Any = None) -> tuple[list[dict[str, Any]], bytes]:
    """What the client gets for a JSON-RPC ``method`` the application answers after ``answer_after`` s."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        request = await receive()
        assert json.loads(request["body"])["method"] == method  # the body reaches the application whole
        await asyncio.sleep(answer_after)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer, "more_body": False})

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [(b"accept", b"application/json, text/event-stream")],
                 "askwright.agent": "planner"}
        await start_early(app, after=0.1, gate=gate)(scope, receive, send)

    asyncio.run(run())
    return sent, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_slow_call_gets_its_stream_early_and_its_answer_on_it():
    sent, body = _call("tools/call", 0.3, b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert dict(sent[0]["headers"])[b"content-type"] == SSE
    assert body.endswith(b'event: message\ndata: {"jsonrpc":"2.0","id":1,"result":{}}\n\n')


def test_a_slow_file_read_is_answered_whole_not_as_one_event_past_what_clients_read():
    # The SDK's client reads server-sent events of at most 1 MiB: a 20 MB
    # file's read that took over a second never reached the agent.
    answer = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"contents": [{"blob": "A" * 3_000_000}]}}).encode()
    turns: list[str] = []

    class Gate:
        def __call__(self, scope: Any) -> Any:
            gate = self

            class Turn:
                async def __aenter__(self) -> None:
                    turns.append(f"in {scope['askwright.agent']}")

                async def __aexit__(self, *_exc: Any) -> None:
                    turns.append("out")
            return Turn()

    sent, body = _call("resources/read", 0.3, answer, gate=Gate())
    assert dict(sent[0]["headers"])[b"content-type"] == b"application/json"
    assert body == answer
    assert turns == ["in planner", "out"]  # held until the answer was sent


def test_a_notification_answered_late_keeps_its_bare_202():
    """The application's 202 for a notification, a second late (its session
    looked up slowly): the early stream had turned it into a 200 event stream
    holding an empty event, which the transport's specification forbids."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        body = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [(b"accept", b"application/json, text/event-stream")]}
        await start_early(app, after=0.1)(scope, receive, send)

    asyncio.run(run())
    assert sent[0]["status"] == 202 and b"".join(m.get("body", b"") for m in sent[1:]) == b""


def _bare_call(body: bytes, accept: bytes, gate: Any = None) -> tuple[list[dict[str, Any]], list[str]]:
    """What the client gets for ``body`` sent with ``accept``, and what reached the application."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(json.loads((await receive())["body"])["method"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})

    sent: list[dict[str, Any]] = []

    async def run() -> None:
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [(b"accept", accept)], "askwright.agent": "planner"}
        await start_early(app, after=0.1, gate=gate)(scope, receive, send)

    asyncio.run(run())
    return sent, reached


def test_a_client_accepting_anything_meets_the_file_reads_gate_and_the_envelopes_checks():
    """``Accept: */*`` (or ``text/*``) is an event stream to the SDK, which
    serves the POST: it skipped the gate that keeps file reads from holding
    the bridge's memory, and the envelope's checks (an id of null answered
    with a 202)."""
    for accept in (b"*/*", b"application/json, text/*", b"application/json"):
        turns: list[str] = []

        class Turn:
            async def __aenter__(self) -> None:
                turns.append("in")

            async def __aexit__(self, *_exc: Any) -> None:
                turns.append("out")

        read = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {}}).encode()
        _sent, reached = _bare_call(read, accept, gate=lambda scope: Turn())
        assert turns == ["in", "out"] and reached == ["resources/read"], accept
        sent, reached = _bare_call(b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', accept)
        assert sent[0]["status"] == 400 and reached == [], accept
        assert json.loads(sent[1]["body"])["error"]["code"] == -32600
