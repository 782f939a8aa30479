"""A real Synapse for the whole session, and a fresh room + bridge per test."""

from __future__ import annotations

import pytest

from bridge.devserver import Synapse
from helpers.harness import Bridge, Person, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def synapse(tmp_path_factory):
    server = Synapse(tmp_path_factory.mktemp("synapse"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def person(synapse):
    people = []

    def make(localpart: str | None = None) -> Person:
        p = Person(synapse, synapse.register(localpart or unique("person")))
        people.append(p)
        return p

    yield make
    for p in people:
        await p.close()


@pytest.fixture
async def bridge(synapse, tmp_path, person):
    """A bot account, a room it made with one person in it, and a bridge not yet started."""
    bot = synapse.register(unique("askbot"))
    alice = person()
    room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id])
    synapse.join(alice.token, room_id)
    env = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_id, bot=bot)
    env.sets_root.mkdir()
    env.alice = alice
    yield env
    env.kill()
