"""People on another homeserver, reached over federation, against two real
Synapses: a homeserver that does not answer for its people changes nothing
the bridge knows of them."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from nio import AsyncClient

from bridge.devserver import _http_json
from bridge.service.encryption.crosssigning import CrossSigning
from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson
from helpers.harness import Bridge, store_rows, unique
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration


def up(server) -> None:
    if server.process is None or server.process.poll() is not None:
        server.start()


async def test_a_stopped_remote_homeserver_settles_none_of_its_people_until_it_answers(federation, tmp_path):
    home, remote, _relay = federation
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


async def wait_log(bridge: Bridge, pattern: str, count: int = 1, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = re.findall(pattern, bridge.log_text())
        if len(found) >= count:
            return found
        bridge.check_alive()
        assert time.monotonic() < deadline, f"{count} x {pattern!r} not logged:\n{bridge.log_text()[-3000:]}"
        await asyncio.sleep(0.2)


async def test_answers_sent_while_her_homeserver_cannot_be_reached_are_not_refused_and_land(federation, tmp_path):
    home, remote, relay = federation
    bot = home.register(unique("askbot"))
    # Alice is on the other homeserver; her client encrypts and she cross-signed her session.
    account = remote.register(unique("alice"))
    laptop = EncryptingPerson(remote, account, tmp_path / "laptop-keys")
    phone = None
    bridge = None
    try:
        identity = await laptop.cross_sign()
        room = home.create_room(bot["access_token"], invite=[laptop.user_id], initial_state=[ENCRYPTION_STATE])
        workdir = tmp_path / "bridge"
        workdir.mkdir()
        bridge = Bridge(synapse=home, workdir=workdir, room_id=room, bot=bot,
                        # A grace far shorter than her homeserver is gone for: that
                        # bound is for a missing key, not for a homeserver that is down.
                        extra_config={"encryption": {"grace": "3s"}})
        bridge.sets_root.mkdir()
        kinds = all_kinds_set("kinds")
        bridge.add_set(kinds)
        bridge.start()
        await wait_log(bridge, r"question posted: kinds/", len(kinds["questions"]))
        # Invited, she is known to the bridge: her laptop's device, signed by her.
        known = re.escape(f"device {laptop.client.device_id} of {laptop.user_id}")
        await wait_log(bridge, rf"{known} .* is verified: cross-signed by its owner")
        # Her homeserver talks to the bridge's (which so has its signing key) ...
        _http_json("POST", f"{remote.url}/_matrix/client/v3/keys/query", {"device_keys": {bot["user_id"]: []}},
                   laptop.token)

        # ... and then cannot be reached from it (it still reaches out) as she
        # joins: the bridge cannot read her keys again.
        relay.cut()
        remote.join(laptop.token, room)
        server = re.escape(remote.server_name)
        unanswered = rf"gave no keys for {re.escape(laptop.user_id)} \({server} did not answer\)"
        # The bridge asked for her keys since she joined (and placed her devices, right or wrong).
        await wait_log(bridge, rf"{unanswered}|{known} .* gets no room keys")
        posted = dict(re.findall(r"question posted: kinds/(\w+) rev 1 as (\S+) in", bridge.log_text()))

        # She answers from her laptop, replying to the questions as Element does
        # (her client cannot read them: they were posted while she was only
        # invited, and room keys go to members; she knows them from elsewhere).
        await until_in_room(laptop, room)
        by_laptop = await laptop.send(room, reply(posted["name"], "Borealis"))
        # Her laptop's device is as it was known: her answer is taken at once.
        record = await bridge.wait_answer("kinds", "name", timeout=60)
        assert record["text"] == "Borealis" and record["source"]["event_id"] == by_laptop

        # And from her phone, a session she signed just now: the bridge cannot
        # read it yet, so the answer waits (and is not refused).
        login = _http_json("POST", f"{remote.url}/_matrix/client/v3/login",
                           {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": laptop.user_id},
                            "password": account["password"]})
        phone = EncryptingPerson(remote, {**login, "password": account["password"]}, tmp_path / "phone-keys")
        await phone.cross_sign(identity)
        await until_in_room(phone, room)
        by_phone = await phone.send(room, reply(posted["takes"], "2"))
        await wait_log(bridge, rf"event {re.escape(by_phone)} from {re.escape(laptop.user_id)} .* waits")
        await wait_log(bridge, unanswered, count=3)  # asked again, later and later

        # Her homeserver is then stopped outright for a while, and comes back reachable.
        remote.stop()
        await asyncio.sleep(10)
        assert "takes" not in bridge.answers("kinds")["answers"]
        relay.mend()
        remote.start()

        # Her phone's answer lands once her homeserver answers; nothing of hers was refused.
        takes = await bridge.wait_answer("kinds", "takes", timeout=120)
        assert takes["source"]["event_id"] == by_phone and takes["source"]["how"] == "reply"
        assert store_rows(bridge.store_path, "SELECT event_id FROM processed WHERE outcome='refused'") == []
        assert not re.search(rf"{known} .* gets no room keys", bridge.log_text())
        assert re.search(rf"device {phone.client.device_id} of .* is verified: cross-signed", bridge.log_text())
        assert bridge.stop() == 0
    finally:
        if bridge is not None:
            bridge.kill()
        relay.mend()
        up(remote)
        await laptop.close()
        if phone is not None:
            await phone.close()


def reply(event_id: str, text: str) -> dict:
    return {"msgtype": "m.text", "body": text, "m.relates_to": {"m.in_reply_to": {"event_id": event_id}}}


async def until_in_room(person: EncryptingPerson, room: str) -> None:
    deadline = time.monotonic() + 30
    while room not in person.client.rooms:
        assert time.monotonic() < deadline, "her client never saw the room she joined"
        await person.keep_up()
        await asyncio.sleep(0.2)
