"""A bare appservice: the reference for "the homeserver pushed it" in
appservice mode, as the bare /sync client is in bot mode.

Registered beside the bridge's own appservice, interested in every room (not
exclusively), it answers each transaction with 200 at once and notes when
each event of it arrived.  It runs in the bench's process and judges, stores
and writes nothing: what the bridge takes beyond it is the bridge's cost.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import yaml
from aiohttp import web

LOCALPART = "bare_receiver"


class BareReceiver:
    def __init__(self, port: int):
        self.port = port
        self.seen: dict[str, float] = {}
        self.runner: web.AppRunner | None = None

    def write_registration(self, base: Path, beside: Path) -> Path:
        """Its registration, asking for what the bridge's registration at
        ``beside`` asks for (ephemeral events, device lists and key counts),
        so the homeserver builds its transactions alike."""
        bridge = yaml.safe_load(beside.read_text())
        extensions = {key: value for key, value in bridge.items() if key not in ("id", "url", "as_token", "hs_token",
                                                                                   "sender_localpart", "namespaces")}
        path = base / "bare-receiver.yaml"
        path.write_text(yaml.safe_dump({
            **extensions,
            "id": "bare-receiver", "url": f"http://127.0.0.1:{self.port}",
            "as_token": secrets.token_hex(16), "hs_token": secrets.token_hex(16),
            "sender_localpart": LOCALPART,
            "namespaces": {"users": [], "aliases": [], "rooms": [{"exclusive": False, "regex": "!.*"}]},
        }))
        return path

    async def _transaction(self, request: web.Request) -> web.Response:
        body = await request.json()
        now = time.perf_counter()
        for event in body.get("events", []):
            self.seen.setdefault(event.get("event_id"), now)
        return web.json_response({})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/_matrix/app/v1/transactions/{txn}", self._transaction)
        app.router.add_put("/transactions/{txn}", self._transaction)
        app.router.add_route("*", "/{tail:.*}", self._nothing)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    @staticmethod
    async def _nothing(_request: web.Request) -> web.Response:
        return web.json_response({"errcode": "M_NOT_FOUND", "error": "nothing here"}, status=404)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


