"""The crash storm in an end-to-end encrypted room, in bot mode and in
appservice mode: three people on encrypting clients send their answers while
the bridge is killed at random moments.  Each person starts a new megolm
session every few answers and shares its key one answer late, so kills land
while room keys are being shared and while the bridge holds answers it
cannot decrypt yet.  Besides everything the plain storm checks
(``helpers.attack.crash_storm``): nothing is left undecrypted in the
bridge's store, and every person decrypts every question the bridge posted.

200 answers per mode keep the suite quick; ASKWRIGHT_ENCRYPTED_STORM=500
runs the issue's full storm."""

from __future__ import annotations

import asyncio
import os

import pytest

from helpers.attack import AS_BOT, appservice_storm_bridge, crash_storm, room_history
from helpers.e2e import ENCRYPTION_STATE
from helpers.e2e_storm import StormingPerson
from helpers.harness import Bridge, question_posts, store_rows, unique

pytestmark = pytest.mark.integration

QUESTIONS = 10
SEED = 20261207
ANSWERS = int(os.environ.get("ASKWRIGHT_ENCRYPTED_STORM", "200"))
# Long enough that no answer is given up on while the storm runs: every one must be decrypted.
ENCRYPTION = {"encryption": {"grace": "10m"}}


async def encrypted_storm(bridge: Bridge, people: list[StormingPerson], seed: int) -> None:
    for p in people:
        await p.cross_sign()  # trust: cross-signed, the default, answers only such devices
    stop = asyncio.Event()
    attending = [asyncio.create_task(p.attend(stop)) for p in people]
    try:
        storm = await crash_storm(bridge, people, seed, questions=QUESTIONS, total=ANSWERS, settle=180)
    finally:
        stop.set()
        await asyncio.gather(*attending, return_exceptions=True)
    print(f"encrypted storm: {sum(p.sessions for p in people)} megolm sessions, "
          f"{sum(p.forwarded for p in people)} keys sent again on request, kills {storm.kills}")
    assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM undecrypted") == [(0,)]
    assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM processed WHERE outcome != 'accepted'") == [(0,)]
    bot = bridge.bot["user_id"]
    for p in people:
        await p.keep_up()  # the bridge's room keys
        events = await room_history(p, bridge.room_id)
        unread = [e["event_id"] for e in events if e["sender"] == bot and e["type"] == "m.room.encrypted"]
        assert unread == [], f"{p.user_id} cannot decrypt {len(unread)} of the bridge's messages"
        posts = question_posts(events)
        assert len(posts) == QUESTIONS and {e["sender"] for e in posts} == {bot}


async def test_encrypted_crash_storm_bot_mode(synapse, tmp_path):
    bot = synapse.register(unique("askbot"))
    people = [StormingPerson(synapse, synapse.register(unique("person")), tmp_path / f"keys-{n}") for n in range(3)]
    room_id = synapse.create_room(bot["access_token"], invite=[p.user_id for p in people],
                                  initial_state=[ENCRYPTION_STATE])
    for p in people:
        synapse.join(p.token, room_id)
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    bridge = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot, extra_config=dict(ENCRYPTION))
    bridge.sets_root.mkdir()
    try:
        await encrypted_storm(bridge, people, SEED)
    finally:
        bridge.kill()
        for p in people:
            await p.close()


async def test_encrypted_crash_storm_appservice_mode(appservice_synapse, tmp_path):
    synapse = appservice_synapse
    people = [StormingPerson(synapse, synapse.register(unique("person")), tmp_path / f"keys-{n}") for n in range(3)]
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    bridge = appservice_storm_bridge(synapse, workdir, people, initial_state=[ENCRYPTION_STATE])
    bridge.extra_config.update(ENCRYPTION)
    assert bridge.bot["user_id"] == AS_BOT
    try:
        await encrypted_storm(bridge, people, SEED + 1)
    finally:
        bridge.kill()
        for p in people:
            await p.close()
