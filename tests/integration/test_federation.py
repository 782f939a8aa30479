"""People on another homeserver, reached over federation, against two real
Synapses: a homeserver that does not answer for its people changes nothing
the bridge knows of them."""

from __future__ import annotations

import asyncio
import time

import pytest
from nio import AsyncClient

from bridge.service.encryption.crosssigning import CrossSigning
from helpers.e2e import EncryptingPerson
from helpers.harness import unique

pytestmark = pytest.mark.integration


def up(server) -> None:
    if server.process is None or server.process.poll() is not None:
        server.start()


async def test_a_stopped_remote_homeserver_settles_none_of_its_people_until_it_answers(federation, tmp_path):
    home, remote = federation
    bot = home.register(unique("askbot"))
    # Carol is on the other homeserver, her session cross-signed; the bridge's
    # homeserver shares no room with her, so it keeps no copy of her keys and
    # asks hers each time.
    carol = EncryptingPerson(remote, remote.register(unique("carol")), tmp_path / "carol-keys")
    client = AsyncClient(home.url, bot["user_id"])
    client.access_token, client.user_id = bot["access_token"], bot["user_id"]
    signing = CrossSigning(client, tmp_path / "keys.json")
    try:
        await carol.cross_sign()
        device, ed25519 = carol.client.device_id, carol.client.olm.account.identity_keys["ed25519"]
        remote.stop()
        await signing.refresh({carol.user_id})
        # The answer named her homeserver in its failures: nothing is known of her, she is asked again.
        assert not signing.known(carol.user_id)
        assert signing.is_pending(carol.user_id) and signing.due_in_ms() > 0
        await asyncio.sleep(signing.due_in_ms() / 1000)
        await signing.refresh(set())  # asked again, still down: later and later
        assert not signing.known(carol.user_id)
        second_wait = signing.due_in_ms()
        assert second_wait > 1000

        remote.start()
        deadline = time.monotonic() + 60
        while not signing.known(carol.user_id):
            assert time.monotonic() < deadline, "her homeserver answered, and the bridge never asked again"
            await asyncio.sleep(max(0.2, signing.due_in_ms() / 1000))
            await signing.refresh(set())
        assert signing.is_cross_signed(carol.user_id, device, ed25519)
        assert not signing.is_pending(carol.user_id) and signing.due_in_ms() is None
    finally:
        up(remote)
        await client.close()
        await carol.close()
