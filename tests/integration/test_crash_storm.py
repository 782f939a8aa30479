"""The crash storm: three people send 500 answers between them while the
bridge is killed with SIGKILL at random moments (a fixed seed), in bot mode
and in appservice mode.  Afterwards every answer is in the log and in
answers.json exactly once, each record's rev is its count of accepted
answers, no question was posted twice, and a reader polling answers.json
throughout never saw a torn file."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from helpers.attack import Storm, TornWatch, appservice_storm_bridge, text_set
from helpers.harness import Bridge, Person, unique

pytestmark = pytest.mark.integration

QUESTIONS = 10
SEED = 20261130


async def storm_through(bridge: Bridge, people: list[Person], seed: int) -> None:
    bridge.add_set(text_set("storm", QUESTIONS))
    rng = random.Random(seed)
    bridge.start()
    # The first kill lands while the bridge is starting or posting its
    # questions: a post sent but not recorded must not be posted again.
    await asyncio.sleep(rng.uniform(0.8, 2.0))
    bridge.kill()
    bridge.start()
    questions = await bridge.wait_questions(people[0], QUESTIONS, timeout=60)
    storm = Storm(bridge, people, questions, seed=seed)
    storm.kills = 1
    began = time.monotonic()
    with TornWatch(bridge.sets_root / "storm" / "answers.json") as watch:
        await storm.run()
        sent_in = time.monotonic() - began
        await storm.settle("storm")
    print(f"sent in {sent_in:.1f} s, all landed {time.monotonic() - began:.1f} s after the first send")
    assert watch.problems == [], watch.problems[:5]
    assert watch.reads > 100
    await storm.check("storm", QUESTIONS, people[0])
    assert storm.kills >= 6
    bridge.check_alive()


async def test_crash_storm_bot_mode(synapse, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    people = [person() for _ in range(3)]
    room_id = synapse.create_room(bot["access_token"], invite=[p.user_id for p in people])
    for p in people:
        synapse.join(p.token, room_id)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_id, bot=bot)
    bridge.sets_root.mkdir()
    try:
        await storm_through(bridge, people, SEED)
    finally:
        bridge.kill()


async def test_crash_storm_appservice_mode(appservice_synapse, tmp_path):
    as_synapse = appservice_synapse
    people = [Person(as_synapse, as_synapse.register(unique("person"))) for _ in range(3)]
    bridge = appservice_storm_bridge(as_synapse, tmp_path, people)
    try:
        await storm_through(bridge, people, SEED + 1)
    finally:
        bridge.kill()
        for p in people:
            await p.close()
