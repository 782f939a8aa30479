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
import os
from pathlib import Path
from typing import Any

from nio import AsyncClient

from bridge.protocol.crosssigning import Identity, cross_signed_devices, the_key, verify

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
    """Written whole (temporary file, fsync, rename), readable by the owner only."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(identity.to_json(user_id), out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


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
                 upload_token: str | None = None):
        self.client = client
        self.path = path
        self.password = password
        # Appservice mode uploads the keys with the as_token: Synapse asks no
        # user-interactive auth of an appservice, even to replace them.
        self.upload_token = upload_token
        self.signed: dict[str, dict[str, str]] = {}  # user -> device -> ed25519, cross-signed by their owner
        self.masters: dict[str, str | None] = {}  # user -> master key last seen
        self.pending: set[str] = set()  # users whose keys changed and were not read yet

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

    async def refresh(self, users: set[str]) -> None:
        """Ask the homeserver for ``users``' cross-signing keys and devices;
        users whose answer did not come are asked again next time."""
        self.pending |= users
        if not self.pending:
            return
        asked = set(self.pending)
        try:
            data = await query(self.client, sorted(asked))
        except Exception as exc:  # noqa: BLE001 - their devices stay as they were until the next pass
            log.warning("reading the cross-signing keys of %d people failed (%s); retrying", len(asked), exc)
            return
        self.pending -= asked
        for user_id in asked:
            master = the_key(data.get("master_keys", {}).get(user_id), user_id, "master")
            before = self.masters.get(user_id, master)
            if before != master:
                log.warning("%s has a new cross-signing identity (master key %s, was %s)", user_id, master, before)
            self.masters[user_id] = master
            self.signed[user_id] = cross_signed_devices(data, user_id)
