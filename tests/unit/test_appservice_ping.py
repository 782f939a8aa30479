"""The ping an appservice bridge asks of its homeserver at start.

A successful ping is what makes Synapse resend at once the transactions it
held while the bridge was away; until then it also drops the to-device
messages (room keys) it would have pushed.  Synapse's ping can fail for a
moment: when it lands while Synapse's own retry of a held transaction is in
flight, Synapse answers 502 ("AlreadyCalled: Tried to cancel an
already-called event", its back-off timer cancelled after it fired).  The
homeserver here is a stand-in for the ping route only, answering in
Synapse's words: no real Synapse can be made to hit that moment on demand.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bridge.devserver import free_port
from bridge.service.config import parse_config
from bridge.service.transport import appservice
from bridge.service.transport.appservice import ping_failure

SYNAPSE_RACE = (502, {"errcode": "M_CONNECTION_FAILED",
                      "error": "AlreadyCalled: Tried to cancel an already-called event."})
NO_PING = (404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})
PINGED = (200, {"duration_ms": 3})


class Homeserver:
    """Answers the ping route with the answers it is given, in turn (the last one from then on)."""

    def __init__(self, answers: list[tuple[int, dict]]):
        self.answers = answers
        self.asked: list[str] = []

    async def ping(self, request: web.Request) -> web.Response:
        self.asked.append(request.headers.get("Authorization", ""))
        status, body = self.answers[min(len(self.asked), len(self.answers)) - 1]
        return web.json_response(body, status=status)


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(appservice, "PING_INTERVAL", 0.01)


def _app(homeserver: Homeserver) -> web.Application:
    app = web.Application()
    app.router.add_post("/_matrix/client/v1/appservice/askwright/ping", homeserver.ping)
    return app


async def pinged(tmp_path: Path, homeserver: Homeserver) -> bool:
    """Whether ``ping_failure`` finds ``homeserver`` pinged us, served for the while."""
    server = TestServer(_app(homeserver))
    await server.start_server()
    try:
        return await ping_failure(config(tmp_path, str(server.make_url("")).rstrip("/"))) is None
    finally:
        await server.close()


def config(tmp_path: Path, url: str):
    return parse_config({
        "homeserver": {"url": url},
        "bot": {"user_id": "@askbot:example.org"},
        "sets": {"root": "sets"},
        "rooms": {"default": "!room:example.org"},
        "store": {"path": "bridge.sqlite"},
        "appservice": {"enabled": True, "id": "askwright", "as_token": "as-secret", "hs_token": "hs-secret",
                       "listen": "127.0.0.1:0"},
    }, base_dir=tmp_path, environ={})


async def test_a_ping_that_lands_on_synapses_own_retry_is_asked_for_again_until_it_is_made(tmp_path, caplog):
    homeserver = Homeserver([SYNAPSE_RACE, SYNAPSE_RACE, PINGED])
    caplog.set_level("INFO", logger=appservice.log.name)
    assert await pinged(tmp_path, homeserver)
    assert homeserver.asked == ["Bearer as-secret"] * 3
    assert "the homeserver reaches the bridge (3 ms)" in caplog.text
    assert "failed" not in caplog.text


async def test_a_homeserver_without_the_ping_is_asked_once(tmp_path, caplog):
    homeserver = Homeserver([NO_PING, PINGED])
    assert not await pinged(tmp_path, homeserver)
    assert len(homeserver.asked) == 1
    assert "the homeserver's ping of the bridge failed: 404 Unrecognized request" in caplog.text


async def test_a_ping_that_keeps_failing_stops_after_its_tries_and_says_why(tmp_path, caplog):
    homeserver = Homeserver([SYNAPSE_RACE])
    assert not await pinged(tmp_path, homeserver)
    assert len(homeserver.asked) == appservice.PING_TRIES
    assert "failed: 502 AlreadyCalled: Tried to cancel an already-called event." in caplog.text


async def test_a_ping_is_not_asked_for_past_its_patience(tmp_path, monkeypatch):
    """The rooms' timelines are looked into only after the ping: a
    homeserver that keeps failing it does not hold that up for long."""
    monkeypatch.setattr(appservice, "PING_INTERVAL", 0.05)
    monkeypatch.setattr(appservice, "PING_PATIENCE", 0.12)
    homeserver = Homeserver([SYNAPSE_RACE])
    assert not await pinged(tmp_path, homeserver)
    assert 2 <= len(homeserver.asked) <= 3 < appservice.PING_TRIES


async def test_a_homeserver_not_listening_yet_is_asked_again(tmp_path):
    homeserver = Homeserver([PINGED])
    runner = web.AppRunner(_app(homeserver))
    await runner.setup()
    port = free_port()  # nothing listens there for the first tries

    async def listen_later() -> None:
        await asyncio.sleep(0.03)
        await web.TCPSite(runner, "127.0.0.1", port).start()

    later = asyncio.ensure_future(listen_later())
    try:
        assert await ping_failure(config(tmp_path, f"http://127.0.0.1:{port}")) is None
    finally:
        await later
        await runner.cleanup()
    assert len(homeserver.asked) == 1


async def test_a_ping_the_homeserver_answers_late_holds_up_the_start_no_longer_than_its_patience(tmp_path, caplog,
                                                                                          monkeypatch):
    """A homeserver that can't reach the bridge's address (a proxy that
    takes the connection and never answers) answers its ping only when it
    gives up itself: Synapse after 60 s.  The start waited those 60 s, not
    the 15 s its patience said (each try waited its full minute), with the
    rooms' timelines unread meanwhile, and as the bridge's own minute ran out
    first the reason it gave was empty.  Patience and Synapse's minute are
    shortened here by the same factor."""
    monkeypatch.setattr(appservice, "PING_PATIENCE", 0.15)
    answered = asyncio.Event()

    async def synapse_giving_up(_request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)  # Synapse's 60 s, scaled as the patience is
        answered.set()
        return web.json_response({"errcode": "M_CONNECTION_TIMEOUT", "error": "Timed out"}, status=504)

    app = web.Application()
    app.router.add_post("/_matrix/client/v1/appservice/askwright/ping", synapse_giving_up)
    server = TestServer(app)
    await server.start_server()
    try:
        started = asyncio.get_running_loop().time()
        why = await ping_failure(config(tmp_path, str(server.make_url("")).rstrip("/")))
        waited = asyncio.get_running_loop().time() - started
    finally:
        await server.close()
    assert waited < 0.45 and not answered.is_set()
    assert why == "no answer to the ping within 0.15 s"
    assert "the homeserver's ping of the bridge failed: no answer to the ping within 0.15 s" in caplog.text
