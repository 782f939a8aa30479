"""An invite whose join fails for now (the homeserver, or a proxy before it,
answers 502; a connection cut; a timeout) is tried again until the bridge is
in, against a real Synapse: the homeserver sends an invite once (in one
incremental sync, or pushed in one transaction), so an invite dropped at its
first failure was lost, and the questions of that room with it.

A relay in front of Synapse (the bridge's homeserver url) answers the
bridge's joins 502 while told to."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.devserver import free_port
from helpers.attack import AS_BOT, Relay, appservice_storm_bridge, text_set
from helpers.harness import Bridge, Person, answer_content, unique
from helpers.direct import bridge_answers_in_direct
from helpers.waiting import until

pytestmark = pytest.mark.integration


def joining(request: Any) -> bool:
    return request.method == "POST" and "/join" in request.path


class FailedJoins:
    """``Relay.fail``: the bridge's joins answered 502, the first ``times`` of them (None: all until ``mend``)."""

    def __init__(self, times: int | None = 1):
        self.left = times
        self.failed = 0

    def __call__(self, request: Any) -> bool:
        if not joining(request) or self.left == 0:
            return False
        if self.left is not None:
            self.left -= 1
        self.failed += 1
        return True

    def mend(self) -> None:
        self.left = 0


def through_relay(bridge: Bridge, homeserver_url: str) -> Relay:
    port = free_port()
    bridge.extra_config["homeserver"] = {"url": f"http://127.0.0.1:{port}"}
    return Relay(("127.0.0.1", port), homeserver_url)


async def kicked_then_invited_back_with_a_failing_join(bridge: Bridge, relay: Relay, alice: Person,
                                                       bot_user: str) -> None:
    """The bridge (posting set alpha in its room) kicked, then invited back
    while its first join fails; set beta is added while it is out."""
    bridge.add_set(text_set("alpha", 1))
    bridge.start()
    await bridge.wait_questions(alice, 1)
    kicked = await alice.client.room_kick(bridge.room_id, bot_user)
    assert not hasattr(kicked, "status_code"), kicked
    await until(lambda: f"removed from room {bridge.room_id}" in bridge.log_text(), what="the kick seen")
    bridge.add_set(text_set("beta", 2))  # its second question (q1) is told apart from alpha's
    failing = FailedJoins(1)
    relay.fail = failing
    invited = await alice.client.room_invite(bridge.room_id, bot_user)
    assert not hasattr(invited, "status_code"), invited
    await until(lambda: failing.failed == 1, what="the bridge's first join, answered 502")
    # Back in: the set added meanwhile is posted there, and answered there.
    question = (await bridge.wait_questions(alice, 2, timeout=60))[("q1", 1)]
    assert question["content"]["set"]["id"] == "beta"
    await alice.send(bridge.room_id, answer_content(question, text="word after the failed join"))
    assert (await bridge.wait_answer("beta", "q1"))["text"] == "word after the failed join"
    bridge.check_alive()


async def test_an_invite_whose_join_failed_once_is_tried_again_in_bot_mode(synapse, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    alice = person()
    room = synapse.create_room(alice.token, invite=[bot["user_id"]])  # alice's: she may kick the bridge out
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room, bot=bot)
    bridge.sets_root.mkdir()
    try:
        async with through_relay(bridge, synapse.url) as relay:
            await kicked_then_invited_back_with_a_failing_join(bridge, relay, alice, bot["user_id"])
    finally:
        bridge.kill()


async def test_an_invite_whose_join_failed_once_is_tried_again_in_appservice_mode(appservice_synapse, tmp_path):
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("ana")))
    bridge = appservice_storm_bridge(hs, tmp_path, [alice])
    try:
        async with through_relay(bridge, hs.url) as relay:
            await kicked_then_invited_back_with_a_failing_join(bridge, relay, alice, AS_BOT)
    finally:
        bridge.kill()
        await alice.close()


async def test_an_admins_invite_not_joined_yet_is_answered_after_a_restart(synapse, tmp_path, person):
    """An admin's direct message: no configured room, so nothing at the next
    start joins it but the invite itself, which the homeserver does not send
    again once the sync token moved past it."""
    bot = synapse.register(unique("askbot"))
    alice = person()
    room = synapse.create_room(alice.token, invite=[bot["user_id"]])
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room, bot=bot,
                    extra_config={"admins": [alice.user_id]})
    bridge.sets_root.mkdir()
    try:
        async with through_relay(bridge, synapse.url) as relay:
            bridge.add_set(text_set("alpha", 1))
            bridge.start()
            question = (await bridge.wait_questions(alice, 1))[("q0", 1)]
            failing = FailedJoins(None)
            relay.fail = failing
            direct = synapse.create_room(alice.token, invite=[bot["user_id"]], is_direct=True)
            await until(lambda: failing.failed >= 1, what="the bridge's join, answered 502")
            # A batch after the invite's moves the sync token past it.
            await alice.send(room, answer_content(question, text="word"))
            await bridge.wait_answer("alpha", "q0")
            bridge.kill()  # stopped before any join went through
            failing.mend()
            bridge.start()

            await bridge_answers_in_direct(alice, bot["user_id"], direct)
    finally:
        bridge.kill()
