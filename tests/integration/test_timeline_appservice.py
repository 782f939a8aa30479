"""The record is what the room's timeline says, in appservice mode: what the
safety net (``catchup``) finds late takes its place in the timeline, not the
place of its arrival.

An event is stranded as Synapse strands one: its transaction is answered by
someone else (a relay in front of the bridge), so the homeserver counts it
as delivered.  The bridge's look into the timeline before the next
transaction (whose id skips one) fails, as when the homeserver has trouble
at that moment (a relay in front of the homeserver answers its timeline
reads with 502), so the later event is judged first and the stranded one
only when a later look finds it."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import pytest

from bridge.devserver import free_port
from helpers.attack import OtherAppservice, Relay, appservice_storm_bridge, start_appservice_synapse
from helpers.harness import Bridge, Person, answer_content, store_rows, unique
from test_timeline_record import answer_edit, one_choice_set, until

pytestmark = pytest.mark.integration

# A look runs after the homeserver goes quiet, or every 30 s (catchup.PERIOD) at the latest.
FOUND_TIMEOUT = 90


def accepted(bridge: Bridge, event_id: str) -> bool:
    return bool(store_rows(bridge.store_path, "SELECT 1 FROM answer_log WHERE event_id=? AND outcome='accepted'",
                           event_id))


def written(bridge: Bridge) -> bool:
    """answers.json holds everything the store has (it is written before the store commits that it was)."""
    return store_rows(bridge.store_path, "SELECT COUNT(*) FROM dirty")[0][0] == 0


class Stranding:
    """A bridge in appservice mode with a relay on each side: one that can
    lose the homeserver's pushes, one that can fail the bridge's reads of
    the room's timeline."""

    def __init__(self, hs: Any, bridge: Bridge):
        registered = urlsplit(hs.appservice["url"])
        bridge_port, homeserver_port = free_port(), free_port()
        bridge.extra_config["appservice"]["listen"] = f"127.0.0.1:{bridge_port}"
        bridge.extra_config["homeserver"] = {"url": f"http://127.0.0.1:{homeserver_port}"}
        self.pushes = Relay((registered.hostname, registered.port), f"http://127.0.0.1:{bridge_port}")
        self.homeserver = Relay(("127.0.0.1", homeserver_port), hs.url)

    async def __aenter__(self) -> "Stranding":
        await self.pushes.__aenter__()
        await self.homeserver.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.homeserver.__aexit__(*exc)
        await self.pushes.__aexit__(*exc)

    async def strand(self, person: Person, room: str, content: dict[str, Any]) -> str:
        """Send ``content``; its transaction never reaches the bridge, and
        the bridge can't read the timeline until ``timeline_back``."""
        self.homeserver.fail = lambda request: "/messages" in request.path
        body = content["body"]
        self.pushes.swallow = lambda event: event.get("content", {}).get("body") == body
        event_id = await person.send(room, content)
        await until(lambda: event_id in self.pushes.swallowed, what="the transaction answered by the relay")
        self.pushes.swallow = lambda event: False
        return event_id

    async def deliver(self, person: Person, room: str, content: dict[str, Any]) -> str:
        """Send ``content``; returns once the bridge has answered its transaction 200 (it is durable)."""
        event_id = await person.send(room, content)
        await until(lambda: event_id in self.pushes.delivered, what="the transaction taken by the bridge")
        return event_id

    def timeline_back(self) -> None:
        self.homeserver.fail = lambda request: False


async def started(hs: Any, tmp_path: Any) -> tuple[Bridge, Person]:
    alice = Person(hs, hs.register(unique("alice")))
    bridge = appservice_storm_bridge(hs, tmp_path, [alice])
    bridge.add_set(one_choice_set())
    return bridge, alice


async def test_a_stranded_older_answer_found_late_does_not_replace_a_newer_one(appservice_synapse, tmp_path):
    hs = appservice_synapse
    bridge, alice = await started(hs, tmp_path)
    try:
        async with Stranding(hs, bridge) as net:
            bridge.start()
            question = (await bridge.wait_questions(alice, 1))[("branch", 1)]
            room = bridge.room_id
            older = await net.strand(alice, room, answer_content(question, option_id="main"))
            newer = await net.deliver(alice, room, answer_content(question, option_id="stable"))
            record = bridge.answers("takes")["answers"]["branch"]
            assert (record["choice"], record["source"]["event_id"]) == ("stable", newer)
            assert not accepted(bridge, older)  # the look before the newer one's transaction failed

            net.timeline_back()
            await until(lambda: accepted(bridge, older) and written(bridge), timeout=FOUND_TIMEOUT,
                        what="the stranded answer found by the safety net")
            # Judged after the newer one, it still takes its place before it in the room.
            record = bridge.answers("takes")["answers"]["branch"]
            assert (record["choice"], record["source"]["event_id"]) == ("stable", newer)
            assert record["rev"] == 2  # both count as answers given
            logged = [row[0] for row in store_rows(bridge.store_path, "SELECT event_id FROM answer_log ORDER BY seq")]
            assert logged == [newer, older]
            assert "came in no transaction" in bridge.log_text()
            bridge.check_alive()
    finally:
        bridge.kill()
        await alice.close()


async def test_an_edit_that_came_before_its_stranded_original_is_not_lost(appservice_synapse, tmp_path):
    hs = appservice_synapse
    bridge, alice = await started(hs, tmp_path)
    try:
        async with Stranding(hs, bridge) as net:
            bridge.start()
            question = (await bridge.wait_questions(alice, 1))[("branch", 1)]
            room = bridge.room_id
            original = await net.strand(alice, room, answer_content(question, option_id="main"))
            await net.deliver(alice, room, answer_edit(question, original, "stable"))
            assert not accepted(bridge, original)

            net.timeline_back()
            await until(lambda: accepted(bridge, original) and written(bridge), timeout=FOUND_TIMEOUT,
                        what="the stranded original found by the safety net")
            # What Alice's client shows: her answer, edited to "stable".
            record = bridge.answers("takes")["answers"]["branch"]
            assert (record["choice"], record["label"]) == ("stable", "The stable branch")
            bridge.check_alive()
    finally:
        bridge.kill()
        await alice.close()


async def test_beside_another_appservice_no_transaction_waits_for_a_look_for_long(tmp_path_factory, tmp_path):
    """Beside another appservice every transaction's id skips one (the
    homeserver numbers all its appservices' transactions from one sequence).
    The bridge looks into the timeline before such a transaction, in case
    one went missing, but not once three looks in a row found nothing
    stranded: each holds an answer up by a round trip to the homeserver.
    The look finds the held transaction's own answer in the timeline, sent
    and not yet taken; that is not stranded.  (It was counted so: every
    look found something, and skips were looked into for as long as the
    bridge ran, three transactions held up every ten seconds.)"""
    async with OtherAppservice() as other:
        workdir = tmp_path_factory.mktemp("beside")
        hs = start_appservice_synapse(workdir, beside=[other.registration(workdir)])
        bridge, alice = await started(hs, tmp_path)
        try:
            async with Stranding(hs, bridge) as net:
                held_up: list[str] = []  # timeline reads while the bridge held a transaction
                net.homeserver.fail = lambda request: bool(
                    "/messages" in request.path and net.pushes.in_flight and held_up.append(request.path))
                bridge.start()
                question = (await bridge.wait_questions(alice, 1))[("branch", 1)]
                room = bridge.room_id

                async def answers(count: int) -> None:
                    for n in range(count):
                        await net.deliver(alice, room, answer_content(question, option_id=("main", "stable")[n % 2]))

                await answers(1)
                assert other.transactions > 0
                # Started again with its question posted: the first transactions are answers'.
                assert await asyncio.to_thread(bridge.stop) == 0  # (the relays go on meanwhile)
                bridge.start()
                held_up.clear()
                await answers(4)
                assert len(held_up) >= 1  # a start looks before the first skips
                # Past the burst the looks may make (catchup.LOOK_WINDOW): each look is its own choice now.
                await asyncio.sleep(11)
                held_up.clear()
                await answers(4)
                assert held_up == []
                assert bridge.answers("takes")["answers"]["branch"]["rev"] == 9
                bridge.check_alive()
        finally:
            bridge.kill()
            await alice.close()
            hs.stop()
