"""The bridge's cross-signed device in appservice mode, as today's clients see
it: a person on matrix-js-sdk excluding insecure devices.

In a module of its own so it runs before the crash storm, which leaves the
session's appservice homeserver considering the appservice down for a while:
Synapse keeps no to-device messages for an appservice it considers down
(docs/encryption.md), and a room key lost so is not what this test is about."""

from __future__ import annotations

import pytest

from helpers.attack import AS_BOT
from helpers.e2e import ENCRYPTION_STATE
from helpers.harness import Bridge, unique
from helpers.jsperson import JsPerson, answers_read_back, from_bridge, wait_log, wait_signed_by_owner
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8


async def test_in_appservice_mode_too_she_reads_every_question_and_her_acknowledgements(appservice_synapse, tmp_path,
                                                                                       js_sdk):
    synapse = appservice_synapse
    alice = JsPerson(synapse, synapse.register(unique("person")), tmp_path / "alice-js.log")
    await alice.start()
    room = synapse.create_room(alice.token, initial_state=[ENCRYPTION_STATE])
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room, bot={"user_id": AS_BOT, "access_token": None},
                    extra_config={"appservice": dict(synapse.appservice), "encryption": {"grace": "60s"}})
    bridge.sets_root.mkdir()
    try:
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        # The appservice user is shared by this session's appservice tests, each
        # with a store (so an identity) of its own: she invites the bridge once
        # its identity for this test is in place, as people meet a bridge that
        # has been running.  (A client that tracked the user while it was only
        # invited may not hear of a reset made before the join.)
        wait_log(bridge, "is cross-signed by its owner", 1)
        synapse.invite(alice.token, room, AS_BOT)
        questions = await bridge.wait_questions(alice, QUESTION_COUNT, timeout=90)

        sent = from_bridge(await alice.messages(room), bridge)
        assert sent and {e["wire_type"] for e in sent} == {"m.room.encrypted"}
        assert [(e["event_id"], e["decryption_failure"]) for e in sent if e["decryption_failure"]] == []
        devices = {e["sender_device"] for e in sent}
        assert len(devices) == 1
        await wait_signed_by_owner(alice, AS_BOT, devices.pop())

        await answers_read_back(alice, bridge, room, questions)
    finally:
        bridge.kill()
        await alice.close()
