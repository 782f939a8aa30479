"""Rooms named in the config by their alias, as people know them in Element
(``rooms.default: "#team:example.org"``): the bridge posts in the rooms the
aliases name and takes the answers there, against a real Synapse."""

from __future__ import annotations

import asyncio

import pytest

from bridge.devserver import free_port
from helpers.attack import AS_BOT, Relay, appservice_storm_bridge, text_set
from helpers.harness import Bridge, Person, answer_content, unique

pytestmark = pytest.mark.integration


async def asked_and_answered(bridge: Bridge, alice: Person, room_id: str, within: float = 30) -> None:
    """Set alpha's question is posted in ``room_id`` within ``within`` seconds,
    and Alice's answer there is recorded."""
    bridge.room_id = room_id  # where the question is looked for
    question = (await bridge.wait_questions(alice, 1, timeout=within))[("q0", 1)]
    await alice.send(room_id, answer_content(question, text="word"))
    record = await bridge.wait_answer("alpha", "q0")
    assert record["text"] == "word" and record["source"]["room_id"] == room_id


def alias_bridge(hs, tmp_path, alice: Person, invited: bool = True) -> tuple[Bridge, str]:
    """An appservice bridge, not yet started, whose rooms.default is the
    alias of a room Alice made (the bridge invited to it, unless not ``invited``)."""
    local = unique("team")
    bridge = appservice_storm_bridge(hs, tmp_path, [alice], room_alias_name=local, invited=invited)
    alias = f"#{local}:{alice.user_id.split(':', 1)[1]}"
    bridge.extra_config = {**bridge.extra_config, "rooms": {"default": alias}}
    bridge.alice = alice
    return bridge, alias


async def test_rooms_named_by_their_alias_get_their_questions_and_answers_in_bot_mode(synapse, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    alice = person()
    server = bot["user_id"].split(":", 1)[1]
    rooms = {}
    for name in ("team", "beta"):
        local = unique(name)
        room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id], room_alias_name=local)
        synapse.join(alice.token, room_id)
        rooms[name] = (f"#{local}:{server}", room_id)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=rooms["team"][1], bot=bot,
                    extra_config={"rooms": {"default": rooms["team"][0], "sets": {"beta": rooms["beta"][0]}}})
    bridge.sets_root.mkdir()
    bridge.alice = alice
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.add_set(text_set("beta", 1))
        bridge.start()
        for set_id, name in (("alpha", "team"), ("beta", "beta")):
            bridge.room_id = rooms[name][1]  # where this set's question is looked for
            question = (await bridge.wait_questions(alice, 1))[("q0", 1)]
            assert question["content"]["set"]["id"] == set_id
            await alice.send(rooms[name][1], answer_content(question, text=f"word for {set_id}"))
            record = await bridge.wait_answer(set_id, "q0")
            assert record["text"] == f"word for {set_id}" and record["source"]["room_id"] == rooms[name][1]
    finally:
        bridge.kill()


async def test_a_room_named_by_its_alias_gets_its_questions_and_answers_in_appservice_mode(appservice_synapse,
                                                                                           tmp_path):
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge, alias = alias_bridge(hs, tmp_path, alice)
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        await asked_and_answered(bridge, alice, bridge.room_id)
    finally:
        bridge.kill()
        await alice.close()


async def _logged(bridge: Bridge, text: str, timeout: float = 30) -> None:
    for _ in range(int(timeout * 10)):
        bridge.check_alive()
        if text in bridge.log_text():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the bridge never logged {text!r}:\n{bridge.log_text()[-3000:]}")


async def test_an_invite_into_the_invite_only_room_an_alias_names_is_taken_in_bot_mode(synapse, tmp_path, person):
    """The usual way to set a team up: a private room with an alias, the
    alias in the config, the bridge started, then invited.  It could not
    join before the invite, so it knows the room only by its alias, and the
    invite names the room's id: it must take the invite, not decline it."""
    bot = synapse.register(unique("askbot"))
    alice = person()
    local = unique("team")
    room_id = synapse.create_room(alice.token, room_alias_name=local)  # private: nobody joins uninvited
    alias = f"#{local}:{alice.user_id.split(':', 1)[1]}"
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_id, bot=bot,
                    extra_config={"rooms": {"default": alias}})
    bridge.sets_root.mkdir()
    bridge.alice = alice
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        await _logged(bridge, f"cannot join {alias}")
        # Invited once the poster, failing to post there meanwhile, backs off
        # 16 s (its tries: twice at the start, then 1, 3, 7 and 15 s on): the
        # join must post the set at once, not at its next try.
        for _ in range(300):
            if bridge.log_text().count("alpha not posted yet") >= 6:
                break
            await asyncio.sleep(0.1)
        synapse.invite(alice.token, room_id, bot["user_id"])
        await asked_and_answered(bridge, alice, room_id, within=8)
    finally:
        bridge.kill()


async def test_an_invite_into_the_invite_only_room_an_alias_names_is_taken_in_appservice_mode(appservice_synapse,
                                                                                               tmp_path):
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge, alias = alias_bridge(hs, tmp_path, alice, invited=False)
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        await _logged(bridge, f"cannot join {alias}")
        hs.invite(alice.token, bridge.room_id, AS_BOT)
        await asked_and_answered(bridge, alice, bridge.room_id)
    finally:
        bridge.kill()
        await alice.close()


async def test_answers_in_the_room_a_question_was_posted_in_count_after_the_config_names_another(synapse, tmp_path,
                                                                                                 person):
    """The operator moves the team to another room (a new room in the
    config, or the alias moved): the questions posted in the old room stay
    open there until answered, and the bridge is still in it, so an answer
    there must count, not be refused as from someone not in the room."""
    bot = synapse.register(unique("askbot"))
    alice = person()
    old = synapse.create_room(alice.token, invite=[bot["user_id"]])  # alice's: she may kick the bridge out
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=old, bot=bot)
    bridge.sets_root.mkdir()
    bridge.alice = alice
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("q0", 1)]
        assert bridge.stop() == 0
        # Made while the bridge is stopped: running, it declines an invite to a room it is not configured for.
        new = synapse.create_room(alice.token, invite=[bot["user_id"]])
        bridge.extra_config = {**bridge.extra_config, "rooms": {"default": new}}
        bridge.start()
        bridge.add_set(text_set("beta", 1))
        bridge.room_id = new  # new sets are posted in the room the config names now
        assert (await bridge.wait_questions(alice, 1))[("q0", 1)]["content"]["set"]["id"] == "beta"
        await alice.send(old, answer_content(question, text="word in the old room"))
        record = await bridge.wait_answer("alpha", "q0")
        assert record["text"] == "word in the old room" and record["source"]["room_id"] == old
        # Kicked from the old room and invited back after a restart: its
        # open question still wants answers, so the invite is taken.
        kicked = await alice.client.room_kick(old, bot["user_id"])
        assert not hasattr(kicked, "status_code"), kicked
        assert bridge.stop() == 0
        bridge.start()
        await _logged(bridge, "--- start 3 ---")
        synapse.invite(alice.token, old, bot["user_id"])
        await _logged(bridge, f"joined {old} at the invite of {alice.user_id}")
        await alice.send(old, answer_content(question, text="word after the invite back"))
        assert (await bridge.wait_answer("alpha", "q0", rev=2))["text"] == "word after the invite back"
    finally:
        bridge.kill()


async def test_answers_in_the_room_a_question_was_posted_in_count_after_the_config_names_another_in_appservice_mode(
        appservice_synapse, tmp_path):
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge = appservice_storm_bridge(hs, tmp_path, [alice])
    old = bridge.room_id
    bridge.alice = alice
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("q0", 1)]
        assert bridge.stop() == 0
        # Made while the bridge is stopped: running, it declines an invite to a room it is not configured for.
        new = hs.create_room(alice.token, invite=[AS_BOT], power_level_content_override={"users": {AS_BOT: 50}})
        bridge.extra_config = {**bridge.extra_config, "rooms": {"default": new}}
        bridge.start()
        bridge.add_set(text_set("beta", 1))
        bridge.room_id = new
        assert (await bridge.wait_questions(alice, 1))[("q0", 1)]["content"]["set"]["id"] == "beta"
        await alice.send(old, answer_content(question, text="word in the old room"))
        record = await bridge.wait_answer("alpha", "q0")
        assert record["text"] == "word in the old room" and record["source"]["room_id"] == old
    finally:
        bridge.kill()
        await alice.close()


async def test_kicked_from_its_room_and_invited_back_the_bridge_rejoins_in_appservice_mode(appservice_synapse,
                                                                                           tmp_path):
    """The homeserver sends an invite again after a restart, into a room the
    bridge is in, and declining that one would leave the room: told apart
    from an invite back after a kick by asking which rooms it is in."""
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge = appservice_storm_bridge(hs, tmp_path, [alice])
    bridge.alice = alice
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()
        await bridge.wait_questions(alice, 1)
        kicked = await alice.client.room_kick(bridge.room_id, AS_BOT)
        assert not hasattr(kicked, "status_code"), kicked
        hs.invite(alice.token, bridge.room_id, AS_BOT)
        await _logged(bridge, f"joined {bridge.room_id} at the invite of {alice.user_id}")
        bridge.add_set(text_set("beta", 2))  # its second question (q1) is the one told apart from alpha's
        assert (await bridge.wait_questions(alice, 2))[("q1", 1)]["content"]["set"]["id"] == "beta"
        assert bridge.stop() == 0  # and a restart, the invite sent again or not, leaves it in the room
        bridge.start()
        await asyncio.sleep(3)
        bridge.add_set(text_set("gamma", 3))
        assert (await bridge.wait_questions(alice, 3))[("q2", 1)]["content"]["set"]["id"] == "gamma"
    finally:
        bridge.kill()
        await alice.close()


async def test_an_invite_back_whose_join_fails_for_now_is_answered_again_in_appservice_mode(appservice_synapse,
                                                                                            tmp_path):
    """The homeserver pushes an invite once, and no sync shows it again: a
    join it refused for now (a restart, its proxy's 502) left the bridge out
    of the room for good, its open questions unanswerable there until the
    bridge itself restarted.  It is asked again until it goes through."""
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge = appservice_storm_bridge(hs, tmp_path, [alice])
    port = free_port()
    bridge.extra_config["homeserver"] = {"url": f"http://127.0.0.1:{port}"}
    refused: list[str] = []
    try:
        async with Relay(("127.0.0.1", port), hs.url) as homeserver:
            bridge.add_set(text_set("alpha", 1))
            bridge.start()
            question = (await bridge.wait_questions(alice, 1))[("q0", 1)]
            kicked = await alice.client.room_kick(bridge.room_id, AS_BOT)
            assert not hasattr(kicked, "status_code"), kicked
            # The bridge's first join after the invite is answered 502, as by a homeserver restarting.
            homeserver.fail = lambda request: ("/join/" in request.path and not refused
                                               and not refused.append(request.path))
            hs.invite(alice.token, bridge.room_id, AS_BOT)
            await _logged(bridge, f"joined {bridge.room_id} at the invite of {alice.user_id}")
            assert len(refused) == 1
            await alice.send(bridge.room_id, answer_content(question, text="back in"))
            assert (await bridge.wait_answer("alpha", "q0"))["text"] == "back in"
            bridge.check_alive()
    finally:
        bridge.kill()
        await alice.close()
