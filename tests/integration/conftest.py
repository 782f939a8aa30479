"""A real Synapse for the whole session, and a fresh room + bridge per test."""

from __future__ import annotations

import json

import pytest

import yaml

from bridge.devserver import Synapse, free_port
from helpers.attack import start_appservice_synapse
from helpers.harness import Bridge, Person, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session", autouse=True)
def no_secret_in_any_bridge_log(tmp_path_factory):
    """After the whole session: no secret any bridge was configured with (bot
    tokens and passwords, appservice tokens, agents' tokens and webhook
    secrets) appears in any log a bridge wrote."""
    yield
    root = tmp_path_factory.getbasetemp()
    found: set[str] = set()
    for path in root.rglob("*.yaml"):
        try:
            data = yaml.safe_load(path.read_text(errors="replace"))
        except yaml.YAMLError:
            continue
        if not isinstance(data, dict):
            continue
        for section, keys in (("bot", ("access_token", "password")), ("appservice", ("as_token", "hs_token")),
                              ("store", ("password",))):
            values = data.get(section)
            if isinstance(values, dict):
                found.update(str(values[k]) for k in keys if values.get(k))
        found.update(str(data[k]) for k in ("as_token", "hs_token") if data.get(k))  # a registration file
        agents = data.get("agents")
        for agent in agents.values() if isinstance(agents, dict) else ():
            if isinstance(agent, dict):
                found.update(str(agent[k]) for k in ("token", "webhook_secret") if agent.get(k))
    for path in root.rglob("*.cross-signing.json"):  # the bridges' private cross-signing keys
        try:
            keys = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found.update(str(v) for k, v in keys.items() if k != "user_id")
    leaks = []
    for log in root.rglob("bridge.log"):
        text = log.read_text(errors="replace")
        leaks.extend(f"{log.parent.name}/{log.name}: {value[:6]}…" for value in found
                     if len(value) >= 8 and value in text)
    assert leaks == [], f"secrets in bridge logs: {leaks}"


@pytest.fixture(scope="session")
def js_sdk():
    """matrix-js-sdk installed for the tests that drive a person on it (tests/js)."""
    from helpers.jsperson import install_js  # noqa: PLC0415

    install_js()


@pytest.fixture(scope="session")
def appservice_synapse(tmp_path_factory):
    """A second homeserver that loads the bridge's appservice registration."""
    server = start_appservice_synapse(tmp_path_factory.mktemp("appservice-shared"))
    yield server
    server.stop()


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


def pytest_collection_modifyitems(config, items):
    """The crash storms run last: the appservice one leaves the session's
    appservice homeserver considering the appservice down for a while, and
    Synapse keeps no to-device messages (room keys) for an appservice it
    considers down (docs/encryption.md); encrypted appservice tests after it
    would lose their room keys to that, not to the bridge."""
    storms = [item for item in items if item.nodeid.startswith("tests/integration/test_crash_storm")]
    if storms:
        items[:] = [item for item in items if item not in storms] + storms


@pytest.fixture(scope="session")
def federation(tmp_path_factory):
    """Two homeservers that federate: (home, remote, relay).  The bridge lives
    on ``home``; people on ``remote`` reach its rooms over federation, and
    ``home`` reaches ``remote`` through ``relay``, which a test may cut and
    mend.  A test may stop and start ``remote``; it leaves it running and the
    relay mended."""
    from helpers.federation import Relay  # noqa: PLC0415

    home = Synapse(tmp_path_factory.mktemp("federation-home"), federates=True)
    remote = Synapse(tmp_path_factory.mktemp("federation-remote"), federates=True, federation_port=free_port())
    relay = Relay(remote.federation_port)
    remote.reached_at = relay.port
    relay.mend()
    home.start()
    remote.start()
    yield home, remote, relay
    relay.cut()
    remote.stop()
    home.stop()
