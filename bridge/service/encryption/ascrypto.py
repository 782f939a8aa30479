"""Appservice mode's end-to-end encryption, by the appservice extensions
Synapse has today (experimental features ``msc2409_to_device_messages_enabled``
and ``msc3202_transaction_extensions``; registration ``receive_ephemeral`` and
``org.matrix.msc3202``, which ``generate-registration`` writes).

Synapse does not let an appservice's own user ``/sync`` (it answers 500), so
the hybrid some bridges use (a crypto-only sync of the bot's device) does not
work for the sender user; everything comes by transactions instead:

* The bridge's user gets a device of its own: logged in once with the
  as_token (``m.login.application_service``), its token and id kept in the
  store, its keys in ``<store.path>.crypto/`` as in bot mode.
* Each transaction's to-device messages for that device (room keys, MSC2409),
  device-list changes and one-time-key counts (MSC3202) are handed to nio as
  a sync response would be, before the transaction's events are judged, so
  a room key and the message it opens may arrive together.
* Encrypted room events are then decrypted, or kept, retried and given up
  on, by the same ``Crypto`` as bot mode.
* Only what is the device's own goes with the device's token: its key
  uploads and to-device messages.  Everything else (room messages,
  encrypted or not, joins, reads) goes with the as_token as before, so the
  appservice's exemption from rate limits holds.  The bridge's
  cross-signing keys are uploaded with the as_token too, which Synapse lets
  replace them without user-interactive auth.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from nio import AsyncClient, WhoamiResponse

from bridge.service.transport.bot import sleep_or_stop
from bridge.service.config import Config, ConfigError
from bridge.service.encryption.crypto import Crypto, available, crypto_dir
from bridge.service.encryption.devicenews import device_sync, hand_to_nio
from bridge.service.encryption.keysmade import keys_lost, keys_made
from bridge.service.transport.matrix import HttpReply, MatrixError, client_config

log = logging.getLogger(__name__)

TOKEN, DEVICE = "as_device_token", "as_device_id"


DEVICE_PATHS = ("/_matrix/client/v3/keys/upload", "/_matrix/client/r0/keys/upload",
                "/_matrix/client/v3/sendToDevice/", "/_matrix/client/r0/sendToDevice/")


class DeviceClient(AsyncClient):
    """nio's client on the bridge's device, sending with the as_token except
    for the requests that must name the device (``DEVICE_PATHS``)."""

    as_token: str | None = None
    device_token: str | None = None

    async def _send(self, response_class: type, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        if self.as_token and self.device_token:
            # nio reads the token before its first await, so no other request sees this one's.
            self.access_token = self.device_token if path.startswith(DEVICE_PATHS) else self.as_token
        return await super()._send(response_class, method, path, *args, **kwargs)


async def device_client(config: Config, store: Any) -> AsyncClient:
    """A client of the bridge's user on a device of its own, with nio's key store loaded."""
    if not available():
        raise ConfigError("encryption.enabled is true but matrix-nio was installed without its e2e extra "
                          "(pip install 'matrix-nio[e2e]'); or set encryption.enabled: false")
    folder = crypto_dir(config.store.path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    user_id = config.bot.user_id
    client = DeviceClient(config.homeserver.url, user_id, store_path=str(folder),
                          config=client_config(encryption=True))
    token, device_id = store.get_meta(TOKEN), store.get_meta(DEVICE)
    if token and device_id:
        client.access_token = token
        whoami = await client.whoami()
        if keys_lost(str(folder), store, user_id, device_id):
            # (A standby given a key folder of its own, or a store restored
            # without it: the old device's one-time keys would be claimed in vain.)
            log.warning("the key folder %s holds no keys of the bridge's device %s (lost, or the store restored "
                        "without it): logging in a new device with the as_token; sign %s out", folder, device_id,
                        device_id)
        elif isinstance(whoami, WhoamiResponse) and whoami.device_id == device_id:
            return _logged_in(client, config, store, device_id, token)
        else:
            log.warning("the bridge's device %s is gone (%s); logging in a new one", device_id,
                        getattr(whoami, "message", "another device"))
    body = {"type": "m.login.application_service", "identifier": {"type": "m.id.user", "user": user_id},
            "initial_device_display_name": config.bot.device_name}
    response = await client.send("POST", "/_matrix/client/v3/login", json.dumps(body),
                                 headers={"Authorization": f"Bearer {config.appservice.as_token}",
                                          "Content-Type": "application/json"})
    try:
        reply = await response.json(content_type=None)
    finally:
        response.release()
    if response.status != 200 or not isinstance(reply, dict) or "access_token" not in reply:
        await client.close()
        raise MatrixError("logging the bridge's device in with the as_token", HttpReply(response.status, reply))
    with store.transaction():
        store.set_meta(TOKEN, reply["access_token"])
        store.set_meta(DEVICE, reply["device_id"])
    log.info("the bridge's user has its own device %s for encryption", reply["device_id"])
    return _logged_in(client, config, store, reply["device_id"], reply["access_token"])


def _logged_in(client: DeviceClient, config: Config, store: Any, device_id: str, token: str) -> DeviceClient:
    client.restore_login(config.bot.user_id, device_id, token)  # also loads nio's key store (made if none)
    client.device_token, client.as_token = token, config.appservice.as_token
    keys_made(store, device_id)
    return client


def extensions_sync(body: dict[str, Any], user_id: str, device_id: str) -> dict[str, Any]:
    """What a transaction carries for the bridge's device, as a sync response
    (the shape nio takes): to-device messages, device lists, key counts."""
    to_device = [{k: v for k, v in event.items() if k not in ("to_user_id", "to_device_id")}
                 for event in _list(body.get("de.sorunome.msc2409.to_device")) + _list(body.get("to_device"))
                 if isinstance(event, dict) and event.get("to_user_id") == user_id
                 and event.get("to_device_id") == device_id]
    lists = body.get("org.matrix.msc3202.device_lists")
    lists = lists if isinstance(lists, dict) else {}
    counts = body.get("org.matrix.msc3202.device_one_time_keys_count") or \
        body.get("org.matrix.msc3202.device_one_time_key_counts") or {}
    entry = counts.get(user_id, {}).get(device_id) if isinstance(counts, dict) and \
        isinstance(counts.get(user_id), dict) else None
    # Synapse names a device with no one-time keys left by an empty entry (a
    # sync says 0): told as 0; no entry at all tells nothing.
    count = {"signed_curve25519": 0, **entry} if isinstance(entry, dict) else {}
    return device_sync(to_device, _list(lists.get("changed")), _list(lists.get("left")), count)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


async def take_extensions(client: AsyncClient, body: dict[str, Any], txn: str) -> bool:
    """Hand the transaction's crypto parts to nio; True when there were any."""
    return await hand_to_nio(client, extensions_sync(body, client.user_id, client.device_id), f"appservice-{txn}")


async def keep_up_kept(crypto: Crypto, store: Any, stop: asyncio.Event,
                       feed_kept: Callable[[], Awaitable[None]], kept: asyncio.Event) -> None:
    """Events kept undecrypted are retried with every transaction; this wakes
    up for their grace periods (and every minute) when no transaction comes.
    ``kept`` is set when encrypted events arrive, so a new grace period is seen."""
    while not stop.is_set():
        await sleep_or_stop(stop, await crypto.sync_timeout_ms(60000) / 1000, wake=kept)
        if stop.is_set():
            return
        if kept.is_set():
            kept.clear()
            continue  # the timeout is worked out again, with what came
        try:
            await crypto.maintain()
            # On the store's thread: on the event loop this look waited for the
            # job in progress there (a batch, a checkpoint), and held the
            # homeserver's pushes, /health and the agents meanwhile.
            if await store.run(store.undecrypted_count):
                await feed_kept()
        except Exception as exc:  # noqa: BLE001 - retried at the next wake-up
            log.warning("retrying the undecrypted events failed (%s)", exc)
            await sleep_or_stop(stop, 1.0)
