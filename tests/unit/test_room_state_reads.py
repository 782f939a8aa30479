"""A room's state read by the bridge (its encryption, its power levels),
through matrix-nio against a homeserver answering as Synapse does.

nio hands over any reply to a state read as the event's content, a
refusal's error body too.  The bridge, not yet in a room it was to post in,
took Synapse's 403 for a room without encryption, kept that, and a question
it sent just as its join completed went out in the clear.  The homeserver
here is a stand-in for the state route only: a real Synapse gives the same
403 to a user outside the room (the integration test
``test_encryption.py::test_a_room_joined_while_a_post_was_refused_gets_nothing_in_the_clear``),
but not a 502 on demand."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from nio import AsyncClient

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import MatrixError, NioTransport, client_config

BOT, ROOM = "@askbot:example.org", "!room:example.org"
MEGOLM = {"algorithm": "m.megolm.v1.aes-sha2"}
NOT_IN_ROOM = (403, {"errcode": "M_FORBIDDEN", "error": f"User {BOT} not in room {ROOM}"})
NO_SUCH_STATE = (404, {"errcode": "M_NOT_FOUND", "error": "Event not found."})
PROXY_DOWN = (502, {"errcode": "M_UNKNOWN", "error": "Bad gateway"})


class Homeserver:
    """Answers every state read with ``answer`` (changed by the test as the room changes)."""

    def __init__(self) -> None:
        self.answer: tuple[int, dict] = NOT_IN_ROOM
        self.asked: list[str] = []

    async def state(self, request: web.Request) -> web.Response:
        self.asked.append(request.match_info["kind"])
        status, body = self.answer
        return web.json_response(body, status=status)


@pytest.fixture
async def homeserver():
    served = Homeserver()
    app = web.Application()
    app.router.add_get("/_matrix/client/v3/rooms/{room}/state/{kind}", served.state)  # the empty state key
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    served.url = str(server.make_url("")).rstrip("/")
    yield served
    await server.close()


@pytest.fixture
async def crypto(homeserver, tmp_path: Path):
    folder = tmp_path / "keys"
    folder.mkdir()
    client = AsyncClient(homeserver.url, BOT, store_path=str(folder), config=client_config(encryption=True))
    client.restore_login(BOT, "BRIDGE", "token")
    yield Crypto(client, Store(tmp_path / "bridge.sqlite"), Encryption())
    await client.close()


async def test_a_room_the_bridge_is_not_in_yet_is_not_taken_for_a_plain_one(homeserver, crypto):
    transport = NioTransport(crypto.client, crypto)
    with pytest.raises(MatrixError, match="reading the encryption state") as refused:
        await transport.room_encrypted(ROOM)
    assert refused.value.permanent  # the send fails, as the post it was for does, and is tried again
    assert ROOM not in crypto.client.rooms  # nothing kept: the next send asks again
    homeserver.answer = (200, MEGOLM)  # joined now
    assert await transport.room_encrypted(ROOM)
    assert crypto.client.rooms[ROOM].encrypted


async def test_an_error_on_the_way_is_no_answer_either(homeserver, crypto):
    homeserver.answer = PROXY_DOWN
    with pytest.raises(MatrixError) as failed:
        await crypto.ensure_room(ROOM)
    assert failed.value.transient and ROOM not in crypto.client.rooms


async def test_a_room_without_encryption_state_is_plain(homeserver, crypto):
    homeserver.answer = NO_SUCH_STATE
    assert not (await crypto.ensure_room(ROOM)).encrypted
    homeserver.answer = (200, {})  # a state event emptied (no algorithm): plain too
    crypto.client.rooms.clear()
    assert not (await crypto.ensure_room(ROOM)).encrypted


async def test_power_levels_read_outside_the_room_are_refused_not_an_error_body(homeserver, crypto):
    transport = NioTransport(crypto.client, crypto)
    with pytest.raises(MatrixError, match="reading the power levels"):
        await transport.power_levels(ROOM)
    homeserver.answer = NO_SUCH_STATE
    assert await transport.power_levels(ROOM) == {}
    levels = {"users": {BOT: 100}, "events_default": 0}
    homeserver.answer = (200, levels)
    assert await transport.power_levels(ROOM) == levels
    assert homeserver.asked == ["m.room.power_levels"] * 3
