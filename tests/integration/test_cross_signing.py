"""The bridge's cross-signed device, as today's clients see it: a person on
matrix-js-sdk with its Rust crypto, cross-signed herself and excluding
insecure devices (OnlySignedDevicesIsolationMode), against a real Synapse."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from bridge.devserver import _http_json
from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson
from helpers.harness import Bridge, answer_content, store_rows, unique
from helpers.jsperson import JsPerson, answers_read_back, from_bridge, wait_log, wait_signed_by_owner
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8
QUESTION_TYPE = "dev.superpipeline.question.v2"
# A room key travels apart from the message it opens; on a loaded machine it
# can come seconds later, and these tests are not about giving up on one.
# (extra_config below: "encryption": {"grace": "60s"}.)


@pytest.fixture
async def room_with_js(synapse, tmp_path, js_sdk):
    """An encrypted room the bot made, a person on matrix-js-sdk in it (already
    cross-signed and excluding insecure devices), and a bridge not yet started."""
    bot = synapse.register(unique("askbot"))
    alice = JsPerson(synapse, synapse.register(unique("person")), tmp_path / "alice-js.log")
    room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id], initial_state=[ENCRYPTION_STATE])
    synapse.join(alice.token, room_id)
    await alice.start()
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    env = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot,
                 extra_config={"encryption": {"grace": "60s"}})
    env.sets_root.mkdir()
    env.alice = alice
    yield env
    env.kill()
    await alice.close()


async def unsigned_member(synapse, bridge: Bridge, tmp_path) -> EncryptingPerson:
    """Bob, in the room: his client encrypts, but he never cross-signed his session."""
    bob = EncryptingPerson(synapse, synapse.register(unique("person")), tmp_path / "bob-keys")
    synapse.invite(bridge.bot["access_token"], bridge.room_id, bob.user_id)
    synapse.join(bob.token, bridge.room_id)
    await bob.keep_up()
    return bob


async def test_a_person_who_excludes_insecure_devices_reads_every_question_and_her_acknowledgements(room_with_js):
    bridge, alice, room = room_with_js, room_with_js.alice, room_with_js.room_id
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)

    # Everything the bridge sent went out encrypted, and her client decrypted
    # all of it: no UNSIGNED_SENDER_DEVICE, no other failure.
    sent = from_bridge(await alice.messages(room), bridge)
    assert sent and {e["wire_type"] for e in sent} == {"m.room.encrypted"}
    assert [(e["event_id"], e["decryption_failure"]) for e in sent if e["decryption_failure"]] == []
    assert len([e for e in sent if e["content"].get("suite_event_type") == QUESTION_TYPE]) == QUESTION_COUNT
    # Her client shows the bridge's device as signed by its owner.
    devices = {e["sender_device"] for e in sent}
    assert len(devices) == 1
    status = await wait_signed_by_owner(alice, bridge.bot["user_id"], devices.pop())
    assert status["signed_by_owner"] is True

    await answers_read_back(alice, bridge, room, questions)
    log = bridge.log_text()
    assert "is cross-signed by its owner" in log
    assert f"device {alice.device_id} of {alice.user_id}" in log and "cross-signed by its owner" in log


async def test_an_answer_from_a_session_its_owner_did_not_verify_is_refused_with_what_to_do(room_with_js, synapse,
                                                                                           tmp_path):
    bridge, alice, room = room_with_js, room_with_js.alice, room_with_js.room_id
    bob = await unsigned_member(synapse, bridge, tmp_path)
    try:
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        questions = await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)
        assert not await bob.questions(room)  # his session got no room keys

        refused = await bob.send(room, answer_content(questions[("name", 1)], text="from an unsigned session"))
        notice = await alice.wait_notice(room, refused, timeout=30)
        outcome = notice["content"]["dev.superpipeline.question.outcome"]
        assert (outcome["outcome"], outcome["reason"]) == ("refused", "device_not_verified")
        assert "Verify this session in your client" in notice["content"]["body"]
        assert "name" not in bridge.answers("kinds")["answers"]
        # Chatting from that session is not answering: nobody is told off for it.
        chat = await bob.send(room, {"msgtype": "m.text", "body": "morning, all"})
        later = await bob.send(room, answer_content(questions[("name", 1)], text="and again"))
        await alice.wait_notice(room, later, timeout=30)  # judged after the chat, so the chat was seen
        assert await alice.notices_for(room, chat) == []
        assert f"device {bob.client.device_id} of {bob.user_id}" in bridge.log_text()
        assert "not cross-signed by its owner" in bridge.log_text()

        # He does what the notice says: his session is cross-signed now, and
        # the bridge takes his next answer (it follows his device list).
        await bob.cross_sign()
        accepted = await bob.send(room, answer_content(questions[("name", 1)], text="now verified"))
        assert (await bridge.wait_answer("kinds", "name", timeout=40))["source"]["event_id"] == accepted
        notice = await alice.wait_notice(room, accepted, timeout=30)
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    finally:
        await bob.close()


async def test_an_answer_sent_in_the_clear_into_the_encrypted_room_is_refused_from_any_session(room_with_js,
                                                                                             synapse, tmp_path):
    # An event sent unencrypted names no device, so no session can be checked:
    # a stolen token's unsigned session (or one with no keys at all) must not
    # approve a deploy by leaving its message in the clear.  Her js-sdk client
    # sends reactions in the clear, as Element does.
    bridge, alice, room = room_with_js, room_with_js.alice, room_with_js.room_id
    bob = await unsigned_member(synapse, bridge, tmp_path)
    try:
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        questions = await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)
        approve = await bob.send_raw(room, "m.room.message",
                                     answer_content(questions[("approve", 1)], option_id="approve"))
        reply = await bob.send_raw(room, "m.room.message", {
            "msgtype": "m.text", "body": "in the clear",
            "m.relates_to": {"m.in_reply_to": {"event_id": questions[("name", 1)]["event_id"]}}})
        reaction = await alice.send(room, {"m.relates_to": {"rel_type": "m.annotation", "key": "1\ufe0f\u20e3",
                                                            "event_id": questions[("ship", 1)]["event_id"]}},
                                    "m.reaction")
        assert {e["event_id"]: e["wire_type"] for e in await alice.messages(room)}[reaction] == "m.reaction"
        chat = await bob.send_raw(room, "m.room.message", {"msgtype": "m.text", "body": "morning, all"})
        for event_id in (approve, reply, reaction):
            notice = await alice.wait_notice(room, event_id, timeout=30)
            outcome = notice["content"]["dev.superpipeline.question.outcome"]
            assert (outcome["outcome"], outcome["reason"]) == ("refused", "device_not_verified")
            assert "Vote in the poll or reply to the question" in notice["content"]["body"]
        assert bridge.answers("kinds")["answers"] == {}
        assert await alice.notices_for(room, chat) == []
        # Her encrypted reply to the same question is hers, from her signed session.
        ship = questions[("ship", 1)]["event_id"]
        taken = await alice.send(room, {"msgtype": "m.text", "body": "1",
                                        "m.relates_to": {"m.in_reply_to": {"event_id": ship}}})
        record = await bridge.wait_answer("kinds", "ship", timeout=40)
        assert (record["source"]["event_id"], record["choice"]) == (taken, "go")
    finally:
        await bob.close()


def own_keys(bridge: Bridge) -> tuple[str, str]:
    """The bridge's master key and current device, as the homeserver has them."""
    user = bridge.bot["user_id"]
    reply = _http_json("POST", f"{bridge.synapse.url}/_matrix/client/v3/keys/query", {"device_keys": {user: []}},
                       bridge.bot["access_token"])
    master = next(iter(reply["master_keys"][user]["keys"].values()))
    [(device,)] = store_rows(bridge.store_path, "SELECT value FROM meta WHERE key='device_id'")
    return master, device


async def test_the_identity_outlives_restarts_and_stores_and_a_lost_key_file_is_a_logged_reset(room_with_js):
    bridge, alice = room_with_js, room_with_js.alice
    user = bridge.bot["user_id"]
    # A login of its own, so a new store means a new device.
    bridge.extra_config = {"bot": {"access_token": None, "password": bridge.bot["password"]}}
    ready = "is cross-signed by its owner"
    key_file = bridge.store_path.with_name(bridge.store_path.name + ".cross-signing.json")

    bridge.start()
    wait_log(bridge, ready, 1)
    master, first_device = own_keys(bridge)
    assert (key_file.stat().st_mode & 0o777) == 0o600
    await wait_signed_by_owner(alice, user, first_device)

    # A restart with the same store: the same device, the same identity.
    assert bridge.stop() == 0
    bridge.start()
    wait_log(bridge, ready, 2)
    assert own_keys(bridge) == (master, first_device)

    # A new store (and key folder) with the key file kept: a new device, signed by the same identity.
    assert bridge.stop() == 0
    bridge.store_path.unlink()
    shutil.rmtree(bridge.store_path.with_name(bridge.store_path.name + ".crypto"))
    bridge.start()
    wait_log(bridge, ready, 3)
    same_master, second_device = own_keys(bridge)
    assert same_master == master and second_device != first_device
    await wait_signed_by_owner(alice, user, second_device)
    assert "cross-signing reset" not in bridge.log_text()

    # Everything lost: a new identity replaces the old one, said so in the log, and signs the new device.
    assert bridge.stop() == 0
    bridge.store_path.unlink()
    shutil.rmtree(bridge.store_path.with_name(bridge.store_path.name + ".crypto"))
    key_file.unlink()
    bridge.start()
    wait_log(bridge, ready, 4)
    new_master, third_device = own_keys(bridge)
    assert new_master != master and third_device not in (first_device, second_device)
    assert f"cross-signing reset: no keys in {key_file}" in bridge.log_text()
    assert master in bridge.log_text() and new_master in bridge.log_text()
    await wait_signed_by_owner(alice, user, third_device)

    # Lost again, and this time only an access token: replacing the identity
    # needs the account's password, so the bridge says what is missing and
    # keeps running, its new device unsigned.
    assert bridge.stop() == 0
    bridge.store_path.unlink()
    shutil.rmtree(bridge.store_path.with_name(bridge.store_path.name + ".crypto"))
    key_file.unlink()
    fresh = _http_json("POST", f"{bridge.synapse.url}/_matrix/client/v3/login",
                       {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
                        "password": bridge.bot["password"]})
    bridge.extra_config = {"bot": {"access_token": fresh["access_token"], "password": None}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    wait_log(bridge, "the bridge's device is not cross-signed", 1)
    assert "set bot.password" in bridge.log_text()
    wait_log(bridge, "question posted: kinds/", QUESTION_COUNT)  # it still serves
    assert own_keys(bridge)[0] == new_master
    deadline = time.monotonic() + 30
    while (status := await alice.device_status(user, fresh["device_id"])) is None:
        assert time.monotonic() < deadline, "her client never saw the bridge's new device"
        await asyncio.sleep(0.5)
    assert status["signed_by_owner"] is False
    # No private key in the log, ever.
    import json  # noqa: PLC0415

    secrets = [v for k, v in json.loads(key_file.read_text()).items() if k != "user_id"]
    assert not [s for s in secrets if s in bridge.log_text()]



async def test_an_answer_from_a_session_logged_out_before_the_bridge_read_it_says_to_answer_again(synapse,
                                                                                               tmp_path):
    """Alice's phone, cross-signed by her, answers while the bridge is down,
    then logs out.  Its trust can't be settled any more (a pin removed, an
    identity reset since), so the answer is not taken; she was asked to
    verify a session that no longer exists, and is now told to answer again
    from a current one."""
    bot = synapse.register(unique("askbot"))
    account = synapse.register(unique("alice"))
    alice = EncryptingPerson(synapse, account, tmp_path / "alice-keys")
    identity = await alice.cross_sign()
    room = synapse.create_room(bot["access_token"], invite=[alice.user_id], initial_state=[ENCRYPTION_STATE])
    synapse.join(alice.token, room)
    login = _http_json("POST", f"{synapse.url}/_matrix/client/v3/login",
                       {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": account["user_id"]},
                        "password": account["password"]})
    phone = EncryptingPerson(synapse, {**login, "password": account["password"]}, tmp_path / "phone-keys")
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    bridge = Bridge(synapse=synapse, workdir=workdir, room_id=room, bot=bot,
                    extra_config={"encryption": {"grace": "60s", "trust": "cross-signed"}})
    bridge.sets_root.mkdir()
    bridge.add_set(all_kinds_set("kinds"))
    try:
        await phone.cross_sign(identity)
        bridge.start()
        questions = await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)
        await phone.keep_up()
        first = await phone.send(room, answer_content(questions[("name", 1)], text="from the phone"))
        notice = await alice.wait_notice(room, first, timeout=40)
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
        assert bridge.stop() == 0
        later = await phone.send(room, answer_content(questions[("ship", 1)], option_id="go"))
        _http_json("POST", f"{synapse.url}/_matrix/client/v3/logout", {}, phone.token)
        bridge.start()
        notice = await alice.wait_notice(room, later, timeout=60)
        outcome = notice["content"]["dev.superpipeline.question.outcome"]
        assert (outcome["outcome"], outcome["reason"]) == ("refused", "device_not_verified"), notice["content"]["body"]
        assert "logged out since" in notice["content"]["body"] and "Verify this session" not in notice["content"]["body"]
        assert "ship" not in bridge.answers("kinds")["answers"]
    finally:
        await phone.close()
        await alice.close()
        bridge.kill()
