"""The bridge's cross-signing identity, and who else's devices are cross-signed.

matrix-nio has no cross-signing, so this module talks to the homeserver
itself (the signing is in ``bridge.protocol.crosssigning``).  Current
clients (matrix-js-sdk's ``OnlySignedDevicesIsolationMode``, Element's
"exclude insecure devices") neither show messages from nor share keys with
a device its owner has not cross-signed: the bridge signs its own device.

The three private keys live in a key file beside the store,
``<store.path>.cross-signing.json`` (mode 0600; ``encryption.cross_signing_keys``
puts it elsewhere).  The file outlives the device: a new store (and so a
new device) with the file kept gets its device signed by the same identity;
without the file the bridge makes a new identity, says so in its log, and
replaces the old one on the homeserver (which may ask for ``bot.password``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

from nio import AsyncClient

from bridge.protocol.crosssigning import Identity, cross_signed_devices, the_key, verify
from bridge.protocol.keyquery import Retries, answered, failed_servers, server_of
from bridge.wholefile import replace_whole

log = logging.getLogger(__name__)

UPLOAD = "/_matrix/client/v3/keys/device_signing/upload"
SIGNATURES = "/_matrix/client/v3/keys/signatures/upload"
QUERY = "/_matrix/client/v3/keys/query"


class CrossSigningError(Exception):
    pass


def keys_file(store_path: Path, configured: str | None = None) -> Path:
    return Path(configured) if configured else store_path.with_name(store_path.name + ".cross-signing.json")


def load_identity(path: Path, user_id: str) -> Identity | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("the cross-signing key file %s cannot be read (%s)", path, type(exc).__name__)
        return None
    if not isinstance(data, dict) or data.get("user_id") != user_id:
        log.warning("the cross-signing key file %s is not for %s", path, user_id)
        return None
    try:
        return Identity.from_json(data)
    except (KeyError, TypeError, ValueError):
        log.warning("the cross-signing key file %s is damaged", path)
        return None


def save_identity(path: Path, identity: Identity, user_id: str) -> None:
    """Written whole (``bridge.wholefile``), readable by the owner only."""
    replace_whole(path, json.dumps(identity.to_json(user_id)).encode(), mode=0o600)


async def call(client: AsyncClient, method: str, path: str, body: dict[str, Any],
               token: str | None = None) -> tuple[int, dict[str, Any]]:
    response = await client.send(method, path, json.dumps(body),
                                 headers={"Authorization": f"Bearer {token or client.access_token}",
                                          "Content-Type": "application/json"})
    try:
        data = await response.json(content_type=None)
    except ValueError:
        data = {}
    finally:
        response.release()
    return response.status, data if isinstance(data, dict) else {}


async def query(client: AsyncClient, users: list[str]) -> dict[str, Any]:
    status, data = await call(client, "POST", QUERY, {"device_keys": {user: [] for user in users}})
    if status != 200:
        raise CrossSigningError(f"querying the keys of {len(users)} users: HTTP {status} {data.get('errcode', '')}")
    return data


class CrossSigning:
    """The bridge's own identity (``ensure``) and the cross-signed devices of others (``refresh``)."""

    def __init__(self, client: AsyncClient, path: Path, password: str | None = None,
                 upload_token: str | None = None, clock: Callable[[], int] | None = None):
        self.client = client
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.path = path
        self.password = password
        # Appservice mode uploads the keys with the as_token: Synapse asks no
        # user-interactive auth of an appservice, even to replace them.
        self.upload_token = upload_token
        self.signed: dict[str, dict[str, str]] = {}  # user -> device -> ed25519, cross-signed by their owner
        self.masters: dict[str, str | None] = {}  # user -> master key last seen
        # Users to ask about, and those asked and not answered for (their
        # homeserver's server unreachable): asked again with backoff.
        self.pending = Retries()

    # -- the bridge's own identity ----------------------------------------

    async def ensure(self) -> Identity:
        """The identity in the key file, on the homeserver, and signing this device."""
        user_id = self.client.user_id
        on_server = the_key((await query(self.client, [user_id])).get("master_keys", {}).get(user_id),
                            user_id, "master")
        identity = load_identity(self.path, user_id)
        if identity is None:
            identity = Identity.generate()
            save_identity(self.path, identity, user_id)  # kept before the homeserver knows it
            if on_server:
                log.warning("cross-signing reset: no keys in %s, so a new identity (master key %s) replaces "
                            "%s on the homeserver; people who verified the bridge must verify it again",
                            self.path, identity.master.public, on_server)
            else:
                log.info("cross-signing identity created (master key %s), its keys kept in %s",
                         identity.master.public, self.path)
        if on_server != identity.master.public:
            await self._upload(identity, replacing=on_server)
        await self._sign_own_device(identity)
        log.info("the bridge's device %s is cross-signed by its owner (master key %s)", self.client.device_id,
                 identity.master.public)
        return identity

    async def _upload(self, identity: Identity, replacing: str | None) -> None:
        user_id = self.client.user_id
        body = identity.upload_body(user_id)
        status, data = await call(self.client, "POST", UPLOAD, body, self.upload_token)
        if status == 401 and "flows" in data:
            if not self.password:
                raise CrossSigningError(
                    "the homeserver asks for the account's password to " +
                    ("replace the cross-signing keys" if replacing else "upload cross-signing keys") +
                    ": set bot.password (or ASKWRIGHT_BRIDGE_PASSWORD)")
            auth = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user_id},
                    "password": self.password}
            if data.get("session"):
                auth["session"] = data["session"]
            status, data = await call(self.client, "POST", UPLOAD, {**body, "auth": auth})
        if status != 200:
            raise CrossSigningError(f"uploading the cross-signing keys: HTTP {status} {data.get('errcode', '')} "
                                    f"{data.get('error', '')}".rstrip())

    async def _sign_own_device(self, identity: Identity) -> None:
        user_id, device_id = self.client.user_id, self.client.device_id
        device = (await query(self.client, [user_id])).get("device_keys", {}).get(user_id, {}).get(device_id)
        if not isinstance(device, dict):
            raise CrossSigningError(f"the homeserver has no keys of the bridge's device {device_id} to sign")
        if verify(device, user_id, identity.self_signing.public):
            return
        device = {k: v for k, v in device.items() if k != "unsigned"}
        signed = identity.self_signing.sign(device, user_id)
        status, data = await call(self.client, "POST", SIGNATURES, {user_id: {device_id: signed}})
        if status != 200 or data.get("failures"):
            raise CrossSigningError(f"uploading the signature of device {device_id}: HTTP {status} "
                                    f"{data.get('failures') or data.get('errcode', '')}")

    # -- other people's devices ---------------------------------------------

    def is_cross_signed(self, user_id: str, device_id: str, ed25519: str) -> bool:
        return self.signed.get(user_id, {}).get(device_id) == ed25519

    def known(self, user_id: str) -> bool:
        return user_id in self.signed

    def is_pending(self, user_id: str) -> bool:
        """Asked about and not answered for yet: what is known of them may be stale."""
        return user_id in self.pending

    def due_in_ms(self) -> int | None:
        """How long until someone is asked about again (None: nobody waits)."""
        return self.pending.due_in_ms(self.clock())

    async def refresh(self, users: set[str]) -> None:
        """Ask the homeserver for ``users``' cross-signing keys and devices,
        with everyone due again.  Only an answer changes what is known of
        someone: a user whose homeserver could not be reached (named in
        ``failures``, or left out of the answer) keeps their devices as they
        were and is asked again later and later."""
        now = self.clock()
        self.pending.add(users, now)
        asked = self.pending.due(now)
        if not asked:
            return
        try:
            data = await query(self.client, sorted(asked))
        except Exception as exc:  # noqa: BLE001 - their devices stay as they were until an answer comes
            wait = self.pending.unanswered(asked, now)
            log.warning("reading the cross-signing keys of %d people failed (%s); asked again in %.0f s",
                        len(asked), exc, wait / 1000)
            return
        settled = answered(asked, data)
        for user_id in settled:
            master = the_key(data.get("master_keys", {}).get(user_id), user_id, "master")
            before = self.masters.get(user_id, master)
            if before != master:
                log.warning("%s has a new cross-signing identity (master key %s, was %s)", user_id, master, before)
            self.masters[user_id] = master
            self.signed[user_id] = cross_signed_devices(data, user_id)
        self.pending.answered(settled)
        unsettled = asked - settled
        if unsettled:
            wait = self.pending.unanswered(unsettled, now)
            failed = failed_servers(data)
            servers = sorted({server_of(user) for user in unsettled})
            log.warning("the homeserver gave no keys for %s (%s): their devices stay as they were, their "
                        "encrypted messages wait, and they are asked again in %.0f s", ", ".join(sorted(unsettled)),
                        ", ".join(f"{server} did not answer" if server in failed else f"nothing from {server}"
                                  for server in servers), wait / 1000)
