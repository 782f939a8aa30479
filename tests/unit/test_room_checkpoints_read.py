"""How ``verify --room`` reads the checkpoints back from the rooms: through
empty pages that still name where to go on (all their events hidden from
the bridge, or left out by the filter), never for ever; against a fake
homeserver on loopback."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiohttp import web

from bridge.protocol.paging import EMPTY_PAGES_AT_MOST
from bridge.service.auditing.checkpoints import STATE_TYPE
from bridge.service.auditing.roomstate import read_room_checkpoints
from helpers.served import served

BRIDGE = "@askbot:example.org"
ORIGIN = "example.org/askwright-bridge/a"


def _checkpoint(note: str) -> dict[str, Any]:
    return {"type": STATE_TYPE, "state_key": ORIGIN, "sender": BRIDGE, "content": {"checkpoint": note, "key": ""}}


class _Homeserver:
    """Two rooms read back from their newest page: ``!hidden``'s newest
    checkpoint, three pages hidden from the bridge (empty, each naming the
    next), an older checkpoint, the start of its history; ``!endless``
    answers every page empty with a new token."""

    def __init__(self) -> None:
        self.asked: dict[str, list[str | None]] = {"!hidden:example.org": [], "!endless:example.org": []}

    def routes(self) -> list[web.RouteDef]:
        base = "/_matrix/client/v3"
        return [web.get(f"{base}/account/whoami", self.whoami), web.get(f"{base}/joined_rooms", self.joined),
                web.get(base + "/rooms/{room}/messages", self.messages)]

    async def whoami(self, _request: web.Request) -> web.Response:
        return web.json_response({"user_id": BRIDGE})

    async def joined(self, _request: web.Request) -> web.Response:
        return web.json_response({"joined_rooms": list(self.asked)})

    async def messages(self, request: web.Request) -> web.Response:
        room, start = request.match_info["room"], request.query.get("from")
        assert request.query["dir"] == "b" and STATE_TYPE in request.query["filter"]
        self.asked[room].append(start)
        if room.startswith("!endless"):
            return web.json_response({"chunk": [], "start": start or "s", "end": f"e{len(self.asked[room])}"})
        page = {None: ([_checkpoint("newest")], "h1"), "h1": ([], "h2"), "h2": ([], "h3"), "h3": ([], "h4"),
                "h4": ([_checkpoint("oldest")], None)}[start]
        return web.json_response({"chunk": page[0], "start": start or "s", **({"end": page[1]} if page[1] else {})})


async def test_verify_room_reads_checkpoints_past_pages_hidden_from_the_bridge_and_says_where_it_gave_up() -> None:
    """``verify --room`` stopped at the first empty page: a checkpoint
    further back than a stretch of history hidden from the bridge was never
    read, and a room that answered empty pages for ever was said to be read
    whole."""
    homeserver = _Homeserver()
    cut: list[tuple[str, int]] = []
    async with served(homeserver.routes()) as port:
        config = SimpleNamespace(homeserver=SimpleNamespace(url=f"http://127.0.0.1:{port}"),
                                 appservice=SimpleNamespace(enabled=False),
                                 bot=SimpleNamespace(access_token="a-token", user_id=BRIDGE))
        user, notes = await read_room_checkpoints(config, on_cut=lambda room, read: cut.append((room, read)))
    assert user == BRIDGE
    assert [(note.room, note.note) for note in notes] == [("!hidden:example.org", "newest"),
                                                                ("!hidden:example.org", "oldest")]
    assert homeserver.asked["!hidden:example.org"] == [None, "h1", "h2", "h3", "h4"]
    # Never for ever, and said: its older checkpoints (if any) are not checked.
    assert len(homeserver.asked["!endless:example.org"]) == EMPTY_PAGES_AT_MOST
    assert cut == [("!endless:example.org", 0)]
