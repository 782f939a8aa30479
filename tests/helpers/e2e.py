"""A person whose client encrypts, for tests in end-to-end encrypted rooms."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nio import AsyncClient, AsyncClientConfig, RoomSendResponse, SyncResponse

from bridge.devserver import Synapse, _http_json
from bridge.protocol.crosssigning import Identity
from helpers.harness import Person

MEGOLM = "m.megolm.v1.aes-sha2"
ENCRYPTION_STATE = {"type": "m.room.encryption", "state_key": "", "content": {"algorithm": MEGOLM}}


class EncryptingPerson(Person):
    """A person on a nio client with its own key store: it uploads its keys,
    shares room keys with every device in the room, and reads what the bridge
    sent decrypted (``messages`` gives the decrypted events)."""

    def __init__(self, synapse: Synapse, account: dict[str, str], store_dir: Path):
        super().__init__(synapse, account)
        store_dir.mkdir(parents=True, exist_ok=True)
        config = AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)
        self.client = AsyncClient(synapse.url, self.user_id, device_id=account["device_id"],
                                  store_path=str(store_dir), config=config)
        self.client.restore_login(self.user_id, account["device_id"], account["access_token"])
        self.plain = AsyncClient(synapse.url, self.user_id)  # raw sends and the view of the wire
        self.plain.access_token = account["access_token"]
        self.plain.device_id = account["device_id"]

    async def keep_up(self) -> SyncResponse:
        """One sync plus the key chores nio's sync_forever would do."""
        response = await self.client.sync(timeout=0, full_state=self.client.next_batch is None)
        assert isinstance(response, SyncResponse), response
        if self.client.should_upload_keys:
            await self.client.keys_upload()
        if self.client.should_query_keys:
            await self.client.keys_query()
        if self.client.should_claim_keys:
            await self.client.keys_claim(self.client.get_users_for_key_claiming())
        await self.client.send_to_device_messages()
        return response

    async def cross_sign(self, identity: Identity | None = None) -> Identity:
        """Give herself a cross-signing identity and sign her device with it,
        as a current client does at first login; with ``identity`` (hers,
        from another session), sign this session with it, as a verified
        session does for a new one."""
        await self.keep_up()  # her device keys are on the homeserver first
        url = self.client.homeserver + "/_matrix/client/v3/keys"
        if identity is None:
            identity = Identity.generate()
            _http_json("POST", f"{url}/device_signing/upload", identity.upload_body(self.user_id), self.token)
        device = _http_json("POST", f"{url}/query", {"device_keys": {self.user_id: [self.client.device_id]}},
                            self.token)["device_keys"][self.user_id][self.client.device_id]
        device.pop("unsigned", None)
        signed = identity.self_signing.sign(device, self.user_id)
        reply = _http_json("POST", f"{url}/signatures/upload", {self.user_id: {self.client.device_id: signed}},
                           self.token)
        assert not reply.get("failures"), reply
        return identity

    async def send(self, room_id: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        await self.keep_up()
        response = await self.client.room_send(room_id, event_type, content, ignore_unverified_devices=True)
        assert isinstance(response, RoomSendResponse), response
        return response.event_id

    async def messages(self, room_id: str, limit: int = 500) -> list[dict[str, Any]]:
        await self.keep_up()  # room keys the bridge sent since the last look
        return await super().messages(room_id, limit)

    async def wire(self, room_id: str) -> list[dict[str, Any]]:
        """The room's events as the homeserver holds them (not decrypted), oldest first."""
        response = await self.plain.room_messages(room_id, start="", limit=500)
        return [event.source for event in reversed(response.chunk)]

    async def send_raw(self, room_id: str, event_type: str, content: dict[str, Any]) -> str:
        """Sent exactly as given: nothing encrypted by the client."""
        response = await self.plain.room_send(room_id, event_type, content)
        assert isinstance(response, RoomSendResponse), response
        return response.event_id

    async def encrypt_withheld(self, room_id: str, content: dict[str, Any],
                               event_type: str = "m.room.message") -> dict[str, Any]:
        """An m.room.encrypted content for ``content`` under a new megolm
        session whose key nobody has been given yet (see ``share_withheld``)."""
        await self.keep_up()
        olm = self.client.olm
        olm.create_outbound_group_session(room_id)
        session = olm.outbound_group_sessions[room_id]
        # Sharing exports the key at the session's current index; the message
        # below is index 0, so the key shared later must be the one from now.
        first_key = session.session_key
        session.__class__ = type("WithheldSession", (type(session),), {"session_key": property(lambda _s: first_key)})
        plaintext = json.dumps({"type": event_type, "content": content, "room_id": room_id})
        out = {"algorithm": MEGOLM, "sender_key": olm.account.identity_keys["curve25519"],
               # The vodozemac session itself: nio's wrapper refuses to encrypt before sharing.
               "ciphertext": session._session.encrypt(plaintext.encode()).to_base64(), "session_id": session.id,
               "device_id": self.client.device_id}
        if "m.relates_to" in content:
            out["m.relates_to"] = content["m.relates_to"]
        return out

    async def encrypt_withheld_many(self, room_id: str, contents: list[dict[str, Any]],
                                    event_type: str = "m.room.message") -> list[dict[str, Any]]:
        """``encrypt_withheld`` for several contents under one new session (one
        late key resolves them all, as when a client's key share is slow)."""
        first = await self.encrypt_withheld(room_id, contents[0], event_type)
        session = self.client.olm.outbound_group_sessions[room_id]
        out = [first]
        for content in contents[1:]:
            plaintext = json.dumps({"type": event_type, "content": content, "room_id": room_id})
            more = {**first, "ciphertext": session._session.encrypt(plaintext.encode()).to_base64()}
            more.pop("m.relates_to", None)
            if "m.relates_to" in content:
                more["m.relates_to"] = content["m.relates_to"]
            out.append(more)
        return out

    async def share_withheld(self, room_id: str) -> None:
        """Give the room's members the key of the session ``encrypt_withheld`` made."""
        await self.client.joined_members(room_id)
        await self.keep_up()
        await self.client.share_group_session(room_id, ignore_unverified_devices=True)

    async def close(self) -> None:
        await self.plain.close()
        await super().close()
