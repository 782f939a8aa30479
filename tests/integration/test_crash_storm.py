"""The crash storm: three people send 500 answers between them while the
bridge is killed with SIGKILL at random moments (a fixed seed), in bot mode
and in appservice mode.  Afterwards every answer is in the log and in
answers.json exactly once, each record's rev is its count of accepted
answers, no question was posted twice, and a reader polling answers.json
throughout never saw a torn file (``helpers.attack.crash_storm``)."""

from __future__ import annotations

import pytest

from helpers.attack import appservice_storm_bridge, crash_storm
from helpers.harness import Bridge, Person, unique

pytestmark = pytest.mark.integration

SEED = 20261130


async def test_crash_storm_bot_mode(synapse, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    people = [person() for _ in range(3)]
    room_id = synapse.create_room(bot["access_token"], invite=[p.user_id for p in people])
    for p in people:
        synapse.join(p.token, room_id)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_id, bot=bot)
    bridge.sets_root.mkdir()
    try:
        await crash_storm(bridge, people, SEED)
    finally:
        bridge.kill()


async def test_crash_storm_appservice_mode(appservice_synapse, tmp_path):
    as_synapse = appservice_synapse
    people = [Person(as_synapse, as_synapse.register(unique("person"))) for _ in range(3)]
    bridge = appservice_storm_bridge(as_synapse, tmp_path, people)
    try:
        await crash_storm(bridge, people, SEED + 1)
    finally:
        bridge.kill()
        for p in people:
            await p.close()
