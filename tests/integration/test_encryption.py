"""Bot mode in end-to-end encrypted rooms, against a real Synapse, with a
person whose client encrypts (its own device keys and megolm sessions)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from urllib.parse import quote

import pytest
from nio import UploadResponse

from bridge.devserver import _http_json
from helpers.attack import AS_BOT
from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson
from helpers.e2e_storm import StormingPerson
from helpers.harness import Bridge, answer_content, hooked, store_rows, unique
from helpers.jsperson import wait_log
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8
POLL_START = "org.matrix.msc3381.poll.start"
POLL_KEY = "dev.superpipeline.question.poll"


BOTH_MODES = pytest.mark.parametrize("encrypted", ["bot", "appservice"], indirect=True)


async def _bridge_beside_alice(request, tmp_path, initial_state: list[dict]) -> Bridge:
    """A room with one encrypting person in it, and a bridge not yet started:
    in bot mode (the bot made the room) or, with the parameter "appservice",
    in appservice mode (she made it and invited the bridge).  ``turn_on``
    turns the room's encryption on, as the room's creator."""
    mode = getattr(request, "param", "bot")
    synapse = request.getfixturevalue("appservice_synapse" if mode == "appservice" else "synapse")
    alice = EncryptingPerson(synapse, synapse.register(unique("person")), tmp_path / "alice-keys")
    if mode == "appservice":
        bot = {"user_id": AS_BOT, "access_token": None}
        room_id = synapse.create_room(alice.token, invite=[AS_BOT], initial_state=initial_state)
        extra = {"appservice": dict(synapse.appservice)}
        creator = alice.token
    else:
        bot = synapse.register(unique("askbot"))
        room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id], initial_state=initial_state)
        synapse.join(alice.token, room_id)
        extra = {}
        creator = bot["access_token"]
    # Her device keys and her cross-signing are on the homeserver before the
    # bridge shares its first room key (trust: cross-signed, the default).
    await alice.cross_sign()
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    env = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot,
                 extra_config={**extra, "encryption": {"grace": "3s"}})
    env.sets_root.mkdir()
    env.alice = alice
    env.turn_on = lambda: _http_json("PUT", f"{synapse.url}/_matrix/client/v3/rooms/{quote(room_id)}/state/"
                                     "m.room.encryption/", ENCRYPTION_STATE["content"], creator)
    return env


@pytest.fixture
async def encrypted(request, tmp_path):
    """An encrypted room (``_bridge_beside_alice``)."""
    env = await _bridge_beside_alice(request, tmp_path, [ENCRYPTION_STATE])
    yield env
    env.kill()
    await env.alice.close()


@pytest.fixture
async def plain_room(request, tmp_path):
    """A room whose encryption is not on yet (``_bridge_beside_alice``)."""
    env = await _bridge_beside_alice(request, tmp_path, [])
    yield env
    env.kill()
    await env.alice.close()


async def started(bridge: Bridge) -> dict:
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    return await bridge.wait_questions(bridge.alice, QUESTION_COUNT, timeout=60)


async def poll_of(person, room: str, question_event_id: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        for event in await person.messages(room):
            content = event.get("content", {})
            if event.get("type") == POLL_START and content.get(POLL_KEY, {}).get("question_event_id") == \
                    question_event_id:
                return event
        assert time.monotonic() < deadline, "no poll for the question"
        await asyncio.sleep(0.2)


@BOTH_MODES
async def test_questions_go_out_encrypted_and_every_way_of_answering_lands(encrypted):
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    questions = await started(bridge)

    # On the wire: nothing the bridge sent is readable without the keys.
    sent_by_bridge = [e for e in await alice.wire(room)
                      if e["sender"] == bridge.bot["user_id"] and "state_key" not in e]
    assert sent_by_bridge and {e["type"] for e in sent_by_bridge} == {"m.room.encrypted"}
    # Decrypted on her side: the full question event.
    branch = questions[("branch", 1)]
    assert branch["content"]["question"]["title"] == "Release branch"
    # Clients send reactions unencrypted, which this room's trust (cross-signed) refuses: the
    # question does not offer keycaps, only the ways that are taken.
    for part in ("body", "formatted_body"):
        assert "keycap" not in branch["content"][part] and "vote in the poll" in branch["content"][part]

    # A question.answer.v2 event.
    await alice.send(room, answer_content(questions[("name", 1)], text="Borealis"))
    # A vote in the question's poll.
    poll = await poll_of(alice, room, branch["event_id"])
    await alice.send(room, {"m.relates_to": {"rel_type": "m.reference", "event_id": poll["event_id"]},
                            "org.matrix.msc3381.poll.response": {"answers": ["stable"]}},
                     "org.matrix.msc3381.poll.response")
    # A reply, as Element sends one.
    takes_question = questions[("takes", 1)]["event_id"]
    reply = await alice.send(room, {"msgtype": "m.text", "body": "2",
                                    "m.relates_to": {"m.in_reply_to": {"event_id": takes_question}}})

    assert (await bridge.wait_answer("kinds", "name"))["text"] == "Borealis"
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "stable"
    takes = await bridge.wait_answer("kinds", "takes")
    assert takes["source"]["how"] == "reply" and takes["source"]["event_id"] == reply
    # The answer log's leaf says which device sent it, and that she had cross-signed it.
    leaf = store_rows(bridge.store_path, "SELECT leaf FROM audit_leaf WHERE idx=?", takes["receipt"]["index"])[0][0]
    assert json.loads(leaf)["device"] == {"device_id": alice.client.device_id, "cross_signed": True}
    # The acknowledgement is encrypted too, and she can read it.
    notice = await alice.wait_notice(room, reply)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    wire_notice = [e for e in await alice.wire(room) if e["event_id"] == notice["event_id"]]
    assert wire_notice[0]["type"] == "m.room.encrypted"
    log = bridge.log_text()
    assert f"device {alice.client.device_id} of {alice.user_id}" in log and "shared with" in log


@pytest.mark.parametrize("plain_room", ["bot", "appservice"], indirect=True)
async def test_a_room_whose_encryption_is_turned_on_while_the_bridge_runs_gets_nothing_in_the_clear(plain_room):
    bridge, alice, room = plain_room, plain_room.alice, plain_room.room_id
    questions = await started(bridge)
    bot = bridge.bot["user_id"]
    before = [e for e in await alice.wire(room) if e["sender"] == bot and "state_key" not in e]
    assert before and "m.room.encrypted" not in {e["type"] for e in before}  # the room was plain

    bridge.turn_on()
    # Her client learns it at its next sync and encrypts her answer.
    reply = await alice.send(room, answer_content(questions[("name", 1)], text="After the switch"))
    assert (await bridge.wait_answer("kinds", "name"))["text"] == "After the switch"
    notice = await alice.wait_notice(room, reply)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    wire = {e["event_id"]: e for e in await alice.wire(room)}
    assert wire[reply]["type"] == "m.room.encrypted"
    assert wire[notice["event_id"]]["type"] == "m.room.encrypted", "the bridge answered in the clear"
    # And after a restart, what it sends there is encrypted too.
    assert bridge.stop() == 0
    bridge.start()
    again = await alice.send(room, answer_content(questions[("ship", 1)], option_id="unsure"))
    assert (await bridge.wait_answer("kinds", "ship"))["state"] == "unsure"
    notice = await alice.wait_notice(room, again)
    assert {e["event_id"]: e for e in await alice.wire(room)}[notice["event_id"]]["type"] == "m.room.encrypted"


# Loaded first by the bridge's interpreter: the bridge hears of its join 2 s
# after the homeserver made it, the moment a post tried before the join may
# be sent in (a join's answer can be that slow on a loaded homeserver).
SLOW_JOIN_ANSWER = '''
import asyncio
from nio import AsyncClient

_join = AsyncClient.join

async def join(self, room_id):
    response = await _join(self, room_id)
    await asyncio.sleep(2)
    return response

AsyncClient.join = join
'''


@pytest.mark.parametrize("mode", ["bot", "appservice"])
async def test_a_room_joined_while_a_post_was_refused_gets_nothing_in_the_clear(request, tmp_path, mode):
    """The bridge starts before it is invited into the encrypted room it is
    to post in: its posts are refused until it is in, then every question
    goes out encrypted (the refusal to read the room's state was taken for a
    room without encryption, and a post sent as the join completed went out
    in the clear)."""
    synapse = request.getfixturevalue("appservice_synapse" if mode == "appservice" else "synapse")
    alice = EncryptingPerson(synapse, synapse.register(unique("person")), tmp_path / "alice-keys")
    room_id = synapse.create_room(alice.token, initial_state=[ENCRYPTION_STATE])
    await alice.cross_sign()
    bot = {"user_id": AS_BOT, "access_token": None} if mode == "appservice" else synapse.register(unique("askbot"))
    bridge = Bridge(synapse=synapse, workdir=tmp_path / "bridge", room_id=room_id, bot=bot,
                    extra_config={**({"appservice": dict(synapse.appservice)} if mode == "appservice" else {}),
                                  "encryption": {"grace": "3s"}})
    bridge.workdir.mkdir()
    bridge.sets_root.mkdir()
    bridge.env = hooked(tmp_path / "hook", SLOW_JOIN_ANSWER)
    try:
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        await asyncio.to_thread(wait_log, bridge, "not posted yet", 2)  # refused: not in the room
        synapse.invite(alice.token, room_id, bot["user_id"])
        await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)
        sent = [e for e in await alice.wire(room_id) if e["sender"] == bot["user_id"] and "state_key" not in e]
        clear = [(e["type"], e["content"].get("body", "")[:60]) for e in sent if e["type"] != "m.room.encrypted"]
        assert sent and clear == [], clear
    finally:
        bridge.kill()
        await alice.close()


async def test_after_a_restart_the_stored_keys_still_decrypt_and_nothing_is_lost(encrypted):
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    questions = await started(bridge)
    await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")
    assert bridge.stop() == 0

    # Sent while the bridge is down, in the session the bridge already has the key of.
    await alice.send(room, answer_content(questions[("name", 1)], text="Sent while it was away"))
    bridge.start()
    assert (await bridge.wait_answer("kinds", "name"))["text"] == "Sent while it was away"
    await alice.send(room, answer_content(questions[("ship", 1)], option_id="unsure"))
    assert (await bridge.wait_answer("kinds", "ship"))["state"] == "unsure"
    # The same device, and no question posted twice.
    assert len([e for e in await alice.messages(room)
                if e.get("content", {}).get("suite_event_type") == "dev.superpipeline.question.v2"]) == QUESTION_COUNT
    assert bridge.answers("kinds")["answers"]["branch"]["choice"] == "main"


@BOTH_MODES
async def test_an_answer_the_bridge_cannot_decrypt_is_not_recorded_and_the_person_is_told(encrypted):
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    questions = await started(bridge)
    question = questions[("branch", 1)]
    # Ciphertext under a session nobody ever shares.
    garbage = {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "A" * 43, "device_id": alice.client.device_id,
               "session_id": "B" * 43, "ciphertext": "AwgAEnB" + "C" * 120,
               "m.relates_to": {"m.in_reply_to": {"event_id": question["event_id"]}}}
    unreadable = await alice.send_raw(room, "m.room.encrypted", garbage)

    notice = await alice.wait_notice(room, unreadable, timeout=40)
    outcome = notice["content"]["dev.superpipeline.question.outcome"]
    assert (outcome["outcome"], outcome["reason"]) == ("refused", "undecryptable")
    assert notice["content"]["msgtype"] == "m.notice"
    assert notice["content"]["m.relates_to"]["m.in_reply_to"]["event_id"] == unreadable
    assert bridge.answers("kinds")["answers"] == {}
    assert store_rows(bridge.store_path, "SELECT outcome FROM processed WHERE event_id=?", unreadable) == [("refused",)]
    assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM undecrypted") == [(0,)]
    assert "could not be decrypted yet" in bridge.log_text()


@BOTH_MODES
async def test_an_answer_whose_keys_arrive_late_is_kept_and_then_recorded(encrypted):
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.extra_config = {**bridge.extra_config, "encryption": {"grace": "10m"}}
    questions = await started(bridge)
    content = answer_content(questions[("branch", 1)], option_id="stable")
    late = await alice.send_raw(room, "m.room.encrypted", await alice.encrypt_withheld(room, content))

    deadline = time.monotonic() + 20
    while store_rows(bridge.store_path, "SELECT event_id FROM undecrypted") != [(late,)]:
        assert time.monotonic() < deadline, f"the event was not kept\n{bridge.log_text()[-3000:]}"
        await asyncio.sleep(0.1)
    assert bridge.answers("kinds")["answers"] == {}

    await alice.share_withheld(room)
    record = await bridge.wait_answer("kinds", "branch", timeout=40)
    assert (record["choice"], record["source"]["event_id"]) == ("stable", late)
    notice = await alice.wait_notice(room, late)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM undecrypted") == [(0,)]


@pytest.mark.parametrize("encrypted", ["appservice"], indirect=True)
async def test_an_answer_kept_for_its_key_through_a_stop_longer_than_the_grace_is_asked_for_and_recorded(
        encrypted, tmp_path):
    """The bridge holds Dora's answer for its key and is killed; her client
    shares the key meanwhile, which Synapse drops (the appservice is down);
    the bridge comes back after more than the grace period.  It asked for
    the key nowhere in that time, so giving up at its first look told her
    to send again an answer her client would give the key of when asked."""
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    grace = 8
    bridge.extra_config = {**bridge.extra_config, "encryption": {"grace": f"{grace}s"}}
    questions = await started(bridge)
    dora = StormingPerson(bridge.synapse, bridge.synapse.register(unique("person")), tmp_path / "dora-keys")
    stop = asyncio.Event()
    attending = None
    try:
        bridge.synapse.invite(alice.token, room, dora.user_id)
        bridge.synapse.join(dora.token, room)
        await dora.cross_sign()
        # Her first message goes out under a session whose key she shares later.
        late = await dora.send(room, answer_content(questions[("branch", 1)], option_id="stable"))
        deadline = time.monotonic() + 30
        while store_rows(bridge.store_path, "SELECT event_id FROM undecrypted") != [(late,)]:
            assert time.monotonic() < deadline, f"the answer was not kept\n{bridge.log_text()[-3000:]}"
            await asyncio.sleep(0.1)
        bridge.kill()
        attending = asyncio.create_task(dora.attend(stop))  # shares the key now, and answers requests for it
        await asyncio.sleep(grace + 2)  # the bridge is away past the answer's grace period
        bridge.start()
        notice = await alice.wait_notice(room, late, timeout=60)
        outcome = notice["content"]["dev.superpipeline.question.outcome"]
        assert outcome["outcome"] == "recorded", notice["content"]["body"]
        assert bridge.answers("kinds")["answers"]["branch"]["source"]["event_id"] == late
        assert dora.forwarded >= 1  # the key came because the bridge asked for it again
    finally:
        stop.set()
        if attending is not None:
            await asyncio.gather(attending, return_exceptions=True)
        await dora.close()


@pytest.mark.parametrize("encrypted", ["appservice"], indirect=True)
async def test_someone_who_joins_later_gets_the_keys_of_what_the_bridge_sends_next(encrypted, tmp_path):
    """Appservice mode has no sync to tell nio of members: a member event in
    a transaction must make the bridge read the members (and use a new room
    key) before it sends again."""
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    questions = await started(bridge)
    bob = EncryptingPerson(bridge.synapse, bridge.synapse.register(unique("person")), tmp_path / "bob-keys")
    try:
        bridge.synapse.invite(alice.token, room, bob.user_id)
        bridge.synapse.join(bob.token, room)
        await bob.cross_sign()
        answer = await bob.send(room, answer_content(questions[("branch", 1)], option_id="main"))
        assert (await bridge.wait_answer("kinds", "branch", timeout=40))["source"]["sender"] == bob.user_id
        # The acknowledgement went out under a key he was given: he reads it.
        notice = await bob.wait_notice(room, answer, timeout=30)
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    finally:
        await bob.close()


@BOTH_MODES
async def test_someone_invited_reads_what_the_bridge_posted_before_they_joined(encrypted, tmp_path):
    """Element shares room keys with those invited (history visible to
    them): a reviewer invited just before an agent's questions were posted
    found each of them "Unable to decrypt" once she joined, while Alice's
    message of the same moment read well: the bridge shared its keys with
    the joined members only."""
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    await started(bridge)
    carol = EncryptingPerson(bridge.synapse, bridge.synapse.register(unique("person")), tmp_path / "carol-keys")
    try:
        await carol.cross_sign()
        bridge.synapse.invite(alice.token, room, carol.user_id)
        await asyncio.sleep(1)  # (the invite reaches the bridge before the set does)
        bridge.add_set(all_kinds_set("later"), name="later")
        deadline = time.monotonic() + 60
        while len([e for e in await alice.messages(room) if e.get("content", {}).get("set", {}).get("id") == "later"
                   and e["content"].get("suite_event_type")]) < QUESTION_COUNT:
            assert time.monotonic() < deadline, "the later set was not posted"
            await asyncio.sleep(0.3)
        bridge.synapse.join(carol.token, room)
        later = {}
        while len(later) < QUESTION_COUNT:
            later = {key: e for key, e in (await carol.questions(room)).items()
                     if e["content"].get("set", {}).get("id") == "later"}
            if time.monotonic() > deadline:
                shown = [e.get("type") for e in await carol.messages(room)]
                raise AssertionError(f"{len(later)} of {QUESTION_COUNT} read; she sees {shown[-20:]}")
            await asyncio.sleep(0.3)
    finally:
        await carol.close()


@BOTH_MODES
async def test_question_media_and_a_persons_file_travel_encrypted(encrypted):
    from nio.crypto.attachments import decrypt_attachment, encrypt_attachment

    from helpers.harness import EXAMPLES

    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.add_set(EXAMPLES / "release-decisions", name="release")
    bridge.start()
    questions = await bridge.wait_questions(alice, 8, timeout=60)
    migration = questions[("migration", 1)]
    item = migration["content"]["question"]["media"][0]
    original = (EXAMPLES / "release-decisions" / "media" / "latency.png").read_bytes()

    deadline = time.monotonic() + 30
    while True:
        thread = [e for e in await alice.messages(room) if e.get("content", {}).get("msgtype") == "m.image"
                  and e["content"].get("m.relates_to", {}).get("event_id") == migration["event_id"]
                  and e["content"].get("body") == item.get("caption", e["content"].get("body"))]
        if thread:
            break
        assert time.monotonic() < deadline, "the image was not posted in the thread"
        await asyncio.sleep(0.2)
    picture = thread[0]["content"]
    assert "url" not in picture and picture["file"]["url"] == item["file"]["url"] == item["url"]
    # What the content repository holds is ciphertext; the key in the event opens it.
    stored = await raw_download(alice, picture["file"]["url"])
    assert stored != original
    file = picture["file"]
    assert decrypt_attachment(stored, file["key"]["k"], file["hashes"]["sha256"], file["iv"]) == original

    # A file the person sends into the question's thread, encrypted the same way.
    await alice.send(room, answer_content(migration, option_id="window"))
    await bridge.wait_answer("release", "migration")
    data = b"\x89PNG\r\n\x1a\n" + b"a screenshot" * 20
    ciphertext, keys = encrypt_attachment(data)
    upload, _ = await alice.client.upload(io.BytesIO(ciphertext), content_type="application/octet-stream",
                                          filename="encrypted", filesize=len(ciphertext))
    assert isinstance(upload, UploadResponse), upload
    root = migration["event_id"]
    sent = await alice.send(room, {"msgtype": "m.image", "body": "shot.png",
                                   "file": {**keys, "url": upload.content_uri},
                                   "info": {"mimetype": "image/png", "size": len(data)},
                                   "m.relates_to": {"rel_type": "m.thread", "event_id": root, "is_falling_back": True,
                                                    "m.in_reply_to": {"event_id": root}}})
    notice = await alice.wait_notice(room, sent)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded", notice["content"]["body"]
    record = await bridge.wait_answer("release", "migration")
    assert record["attachments"] == ["attachments/migration-1.png"]
    assert (bridge.sets_root / "release" / "attachments" / "migration-1.png").read_bytes() == data


async def raw_download(person, mxc: str) -> bytes:
    server, media_id = mxc.removeprefix("mxc://").split("/", 1)
    response = await person.plain.send("GET", f"/_matrix/client/v1/media/download/{server}/{media_id}",
                                       headers={"Authorization": f"Bearer {person.token}"})
    try:
        assert response.status == 200, response.status
        return await response.read()
    finally:
        response.release()


async def test_trust_verified_shares_keys_only_with_pinned_devices_and_refuses_the_rest(encrypted, synapse, tmp_path):
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bob = EncryptingPerson(synapse, synapse.register(unique("person")), tmp_path / "bob-keys")
    try:
        synapse.invite(bridge.bot["access_token"], room, bob.user_id)
        synapse.join(bob.token, room)
        await bob.keep_up()
        fingerprint = alice.client.olm.account.identity_keys["ed25519"]
        grouped = " ".join(fingerprint[i:i + 4] for i in range(0, len(fingerprint), 4))  # as Element shows it
        bridge.extra_config = {"encryption": {"trust": "verified",
                                              "verified_devices": {alice.user_id: {alice.client.device_id: grouped}}}}
        questions = await started(bridge)  # alice reads them: her device got the keys
        assert not await bob.questions(room)  # bob's did not

        await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
        assert (await bridge.wait_answer("kinds", "branch"))["source"]["sender"] == alice.user_id
        refused = await bob.send(room, answer_content(questions[("name", 1)], text="from an unverified device"))
        notice = await alice.wait_notice(room, refused)
        outcome = notice["content"]["dev.superpipeline.question.outcome"]
        assert (outcome["outcome"], outcome["reason"]) == ("refused", "device_not_verified")
        assert "name" not in bridge.answers("kinds")["answers"]
        assert f"device {bob.client.device_id} of {bob.user_id}" in bridge.log_text()
        assert "gets no room keys" in bridge.log_text()
    finally:
        await bob.close()


async def test_with_encryption_off_a_plain_room_works_and_no_key_folder_is_made(bridge):
    bridge.extra_config = {"encryption": {"enabled": False}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    assert (await bridge.wait_answer("kinds", "branch"))["choice"] == "main"
    assert not bridge.store_path.with_name(bridge.store_path.name + ".crypto").exists()


async def test_a_lost_key_folder_is_a_new_device_with_a_password_and_a_refusal_with_a_token(encrypted):
    """The key folder lost, the store kept: the bridge made a new account
    under the old device id, the homeserver kept the old one's one-time keys,
    and every answer was refused as undecryptable, the person blamed."""
    import shutil
    import subprocess

    from bridge.service.encryption.crypto import crypto_dir

    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    password = bridge.bot["password"]
    questions = await started(bridge)
    assert bridge.stop() == 0

    shutil.rmtree(crypto_dir(bridge.store_path))
    bridge.start()  # with the configured token: refused at once, saying what to do
    try:
        code = bridge.process.wait(60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the bridge ran on without its keys\n{bridge.log_text()[-3000:]}") from None
    assert code == 2 and "holds no keys of device" in bridge.log_text()

    bridge.bot = {**bridge.bot, "access_token": None}
    bridge.extra_config = {**bridge.extra_config, "bot": {"password": password, "access_token": None}}
    bridge.start()  # logs in afresh, as its first device (its keys are on disk from now on)
    await asyncio.sleep(3)
    # A current client shares its room key with a device that joined since
    # (nio, as Alice, shares a session once): her next session is shared anew.
    alice.client.olm.outbound_group_sessions.pop(room, None)
    await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch", timeout=60)
    await _key_folder_lost_then_read(bridge, questions)  # with a password: a new device, which reads
    assert "logging in with bot.password as a new device" in bridge.log_text()


async def _key_folder_lost_then_read(bridge, questions) -> None:
    """The bridge stopped, its key folder removed, started again: Alice's
    next answer (her room key shared anew) is read and recorded."""
    import shutil

    from bridge.service.encryption.crypto import crypto_dir

    alice, room = bridge.alice, bridge.room_id
    assert bridge.stop() == 0
    shutil.rmtree(crypto_dir(bridge.store_path))
    bridge.start()
    await asyncio.sleep(3)
    alice.client.olm.outbound_group_sessions.pop(room, None)
    sent = await alice.send(room, answer_content(questions[("name", 1)], text="after the loss"))
    assert (await bridge.wait_answer("kinds", "name", timeout=60))["text"] == "after the loss"
    notice = await alice.wait_notice(room, sent, timeout=60)
    assert "Not recorded" not in notice.get("body", ""), notice


@pytest.mark.parametrize("encrypted", ["appservice"], indirect=True)
async def test_a_lost_key_folder_in_appservice_mode_is_a_new_device_that_reads_what_people_send(encrypted):
    """Appservice mode checked only that its device still existed: with the
    key folder lost (or a standby given a folder of its own) it made a new
    account under the old device id, whose one-time keys people's clients
    never claimed, and every encrypted answer was refused as undecryptable."""
    bridge = encrypted
    questions = await started(bridge)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch", timeout=60)
    await _key_folder_lost_then_read(bridge, questions)
    assert "holds no keys of the bridge's device" in bridge.log_text()
