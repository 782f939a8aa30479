"""Asking for the key of a message the bridge cannot decrypt yet, and taking
the answer from the person who sent it.

A room key comes once, as a to-device message, and can be lost: in
appservice mode Synapse drops the to-device messages of a transaction it
could not deliver and every one sent while it considers the bridge down
(docs/encryption.md), which a crash of the bridge causes.  The sender's
client still holds the session and re-shares it with a device it gave it
to before when that device asks (``m.room_key_request`` answered with an
``m.forwarded_room_key``; matrix-rust-sdk, so Element, does).  So:

* the request goes to the sender's device as well as to the bridge's own
  other sessions (nio asks only the latter), and is asked again every
  ``REASK_MS`` while the message is kept: an answer lost like the key was
  (the bridge restarted, Synapse not yet delivering again) is asked for
  again once it delivers;
* nio accepts forwarded keys only from the account's own verified
  devices; the bridge also accepts one from the session's own creator: the
  Olm channel it came by is the device whose curve25519 key started the
  session, the key was forwarded by nobody else (empty chain), and the
  ed25519 key it claims is that device's.  That is exactly what an
  ``m.room_key`` from that device proves, no more trust than the key the
  bridge missed.  Whether the message is then accepted as an answer is the
  trust policy's, as for any other.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from nio import AsyncClient, MegolmEvent
from nio.crypto.key_request import OutgoingKeyRequest

log = logging.getLogger(__name__)

REASK_MS = 5000


class KeyRequests:
    """The bridge's requests for missing room keys, at most one per session every ``REASK_MS``."""

    def __init__(self, client: AsyncClient, clock: Callable[[], int]):
        self.client = client
        self.clock = clock
        self._asked: dict[str, int] = {}  # session id -> when it was last asked for
        self._patched: Any = None

    def due_in_ms(self) -> int | None:
        """How long until a kept message's key is asked for again (None: nothing asked)."""
        if not self._asked:
            return None
        return max(0, min(self._asked.values()) + REASK_MS - self.clock())

    async def ask(self, kept: list[dict[str, Any]]) -> None:
        """Ask for the keys of the ``kept`` encrypted events not asked for lately."""
        olm = self.client.olm
        if olm is None:
            return
        self._accept_from_creators()
        now = self.clock()
        parsed_events = []
        for event in kept:
            parsed = MegolmEvent.from_dict(event)
            if isinstance(parsed, MegolmEvent):
                parsed.room_id = event["room_id"]
                parsed_events.append((event, parsed))
        # Sessions no longer kept for are forgotten: their keys came.
        wanted = {parsed.session_id for _event, parsed in parsed_events}
        self._asked = {s: when for s, when in self._asked.items() if s in wanted}
        for event, parsed in parsed_events:
            if now - self._asked.get(parsed.session_id, now - REASK_MS) < REASK_MS:
                continue
            self._asked[parsed.session_id] = now
            own = parsed.as_key_request(self.client.user_id, self.client.device_id)
            sender = parsed.as_key_request(parsed.sender, self.client.device_id, device_id=parsed.device_id or "*")
            if parsed.session_id not in olm.outgoing_key_requests:
                request = OutgoingKeyRequest.from_message(own)
                olm.outgoing_key_requests[parsed.session_id] = request
                olm.store.add_outgoing_key_request(request)
            try:
                for message in (own, sender):
                    await self.client.to_device(message)
            except Exception as exc:  # noqa: BLE001 - best effort; asked again in REASK_MS
                log.info("asking for the key of %s failed: %s", event.get("event_id"), exc)

    def _accept_from_creators(self) -> None:
        """Wrap nio's check of a forwarded key once per olm machine (nio makes a new one on login)."""
        olm = self.client.olm
        if olm is None or self._patched is olm:
            return
        nio_check = olm._should_accept_forward

        def should_accept(sender: str, sender_key: str, event: Any) -> bool:
            return nio_check(sender, sender_key, event) or _from_creator(olm, sender, sender_key, event)

        olm._should_accept_forward = should_accept
        self._patched = olm


def _from_creator(olm: Any, sender: str, sender_key: str, event: Any) -> bool:
    content = event.source.get("content", {}) if isinstance(event.source, dict) else {}
    request = olm.outgoing_key_requests.get(event.session_id)
    if request is None or request.room_id != event.room_id or event.algorithm != request.algorithm:
        return False
    if content.get("sender_key") != sender_key or content.get("forwarding_curve25519_key_chain"):
        return False
    device = olm.device_store.device_from_sender_key(sender, sender_key)
    if device is None or device.deleted or device.ed25519 != content.get("sender_claimed_ed25519_key"):
        return False
    log.info("room key %s… for %s taken from its creator %s/%s, who was asked for it again", event.session_id[:10],
             event.room_id, sender, device.id)
    return True
