"""People for the encrypted crash storm: encrypting clients that start a new
megolm session every few answers and share its key one answer late (so the
bridge holds answers for decryption while it is being killed), and that
answer a request for a session's key from a device they gave it to, as
current clients do (matrix-rust-sdk re-shares a session with another user's
device when it was shared with that device before); nio itself answers only
its own user's devices."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nio import RoomKeyRequest, SyncResponse

from bridge.devserver import Synapse
from helpers.e2e import EncryptingPerson


class StormingPerson(EncryptingPerson):

    def __init__(self, synapse: Synapse, account: dict[str, str], store_dir: Path, rotate_every: int = 16):
        super().__init__(synapse, account, store_dir)
        self.rotate_every = rotate_every
        # One request at a time on the client: its sync token, olm sessions
        # and megolm ratchets are not safe to use from several sends at once.
        self.lock = asyncio.Lock()
        self.sends = 0
        self.sessions = 0
        self.forwarded = 0  # keys sent again because the bridge asked for them
        self._unshared: str | None = None  # the room whose newest session's key is not shared yet
        self._shared_with: dict[str, set[tuple[str, str]]] = {}  # session id -> devices given its key

    async def send(self, room_id: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        async with self.lock:
            if self._unshared:
                await self._share_late()
            if self.sends % self.rotate_every == 0:
                # A new session whose first message goes out before its key does.
                encrypted = await self.encrypt_withheld(room_id, content, event_type)
                event_id = await self.send_raw(room_id, "m.room.encrypted", encrypted)
                self._unshared = room_id
                self.sessions += 1
            else:
                event_id = await super().send(room_id, content, event_type)
                self._note_shared(room_id)
            self.sends += 1
            return event_id

    async def _share_late(self) -> None:
        assert self._unshared is not None
        await self.share_withheld(self._unshared)
        self._note_shared(self._unshared)
        self._unshared = None

    def _note_shared(self, room_id: str) -> None:
        session = self.client.olm.outbound_group_sessions.get(room_id)
        if session is not None:
            self._shared_with.setdefault(session.id, set()).update(session.users_shared_with)

    async def keep_up(self) -> SyncResponse:
        response = await super().keep_up()
        for event in response.to_device_events:
            if isinstance(event, RoomKeyRequest) and event.sender != self.user_id:
                await self._answer(event)
        return response

    async def _answer(self, request: RoomKeyRequest) -> None:
        olm = self.client.olm
        own_key = olm.account.identity_keys["curve25519"]
        if request.sender_key != own_key or \
                (request.sender, request.requesting_device_id) not in self._shared_with.get(request.session_id, ()):
            return
        group = olm.inbound_group_store.get(request.room_id, own_key, request.session_id)
        try:
            device = olm.device_store[request.sender][request.requesting_device_id]
        except KeyError:
            return
        session = olm.session_store.get(device.curve25519) if device else None
        if group is None or session is None:
            return
        await self.client.to_device(olm._encrypt_forwarding_key(request.room_id, group, session, device))
        self.forwarded += 1

    async def messages(self, room_id: str, limit: int = 500) -> list[dict[str, Any]]:
        async with self.lock:
            return await super().messages(room_id, limit)

    async def attend(self, stop: asyncio.Event) -> None:
        """A client left open: it syncs now and then, so it answers key requests
        and shares a late key even when its person sends nothing."""
        while not stop.is_set():
            async with self.lock:
                if self._unshared:
                    await self._share_late()
                await self.keep_up()
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass
