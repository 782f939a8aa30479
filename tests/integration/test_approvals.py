"""Approvals against a real Synapse (PROTOCOL 2a): a deadline kept with the
bridge running and while it is down (the homeserver's own delayed poll end,
or, without delayed events, the bridge's at its next start), an answer a
second late refused in both cases, and a 2-of-3 approval with a veto through
votes, a changed vote, a withdrawn vote, a stranger and a kill -9."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bridge.devserver import Synapse
from helpers.attack import appservice_storm_bridge
from helpers.harness import Bridge, Person, unique
from test_element import element_edit, element_reply, polls, vote
from test_encryption import encrypted  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

OUTCOME = "dev.superpipeline.question.outcome"
POLL_END = "org.matrix.msc3381.poll.end"


def approval_set(people: list[str], expires: str, required: int = 2) -> dict[str, Any]:
    return {"askwright": 1, "id": "release", "title": "Release 2.4", "questions": [{
        "id": "ship", "kind": "choice", "title": "Ship 2.4",
        "question": "Should 2.4 go to production today?",
        "why": "The release train leaves at noon and the next one is a week later.",
        "options": [{"id": "ship", "label": "Ship it to production"},
                    {"id": "hold", "label": "Hold it for a week"}],
        "guess": {"option": "ship", "why": "Every check is green.", "confidence": "low"},
        "answerers": people, "quorum": {"required": required, "veto": ["hold"]}, "expires": expires}]}


async def joined(synapse: Synapse, room: str, owner_token: str, count: int) -> list[Person]:
    people = []
    for _ in range(count):
        person = Person(synapse, synapse.register(unique("voter")))
        synapse.invite(owner_token, room, person.user_id)
        synapse.join(person.token, room)
        people.append(person)
    return people


def record(bridge: Bridge) -> dict[str, Any] | None:
    return bridge.answers("release")["answers"].get("ship")


async def until(check, timeout: float = 30, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return found
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} did not happen within {timeout} s")


async def bot_events(person: Person, room: str, bot: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in await person.messages(room) if e["sender"] == bot and e["type"] == kind]


async def late_answer_is_refused(bridge: Bridge, person: Person, question: dict[str, Any]) -> None:
    late = await person.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
    notice = await person.wait_notice(bridge.room_id, late, timeout=30)
    assert notice["content"][OUTCOME]["reason"] == "expired"
    assert "expired at" in notice["content"]["body"]
    assert record(bridge)["state"] == "expired"


async def test_a_deadline_with_the_bridge_running_and_an_answer_a_second_late(bridge, synapse):
    alice = bridge.alice
    bob, = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 1)
    try:
        bridge.add_set(approval_set([alice.user_id, bob.user_id], "8s"))
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("ship", 1)]
        assert "Answer by" in question["content"]["body"] and bob.user_id in question["content"]["body"]
        voted = await alice.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
        ack = await alice.wait_notice(bridge.room_id, voted)
        assert "1 of 2 for \u201cShip it to production\u201d so far; waiting for " + bob.user_id in ack["content"]["body"]
        assert record(bridge)["state"] == "pending"
        expired = await until(lambda: (record(bridge) or {}).get("state") == "expired" and record(bridge), 40,
                              "the expiry")
        assert "choice" not in expired and [v["sender"] for v in expired["votes"]] == [alice.user_id]
        # The poll ended (by the homeserver's delayed event) and the question says why.
        assert await until(lambda: bot_events(alice, bridge.room_id, bridge.bot["user_id"], POLL_END), 20, "poll end")
        told = await until(lambda: _said(alice, bridge, "expired undecided"), 20, "the expiry notice")
        assert "1 of 2 votes agreeing" in told
        await asyncio.sleep(1)
        await late_answer_is_refused(bridge, bob, question)
    finally:
        await bob.close()


async def _said(person: Person, bridge: Bridge, words: str) -> str | None:
    for event in await bot_events(person, bridge.room_id, bridge.bot["user_id"], "m.room.message"):
        body = event["content"].get("body", "")
        if words in body:
            return body
    return None


async def test_a_deadline_while_the_bridge_is_down_is_kept_by_the_homeserver(bridge):
    alice = bridge.alice
    bridge.add_set(approval_set([alice.user_id], "6s", required=1))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1))[("ship", 1)]
    await polls(alice, bridge.room_id, timeout=5)
    bridge.kill()  # kill -9, right after posting
    # The homeserver ends the poll and edits the question itself, on time.
    ended = await until(lambda: bot_events(alice, bridge.room_id, bridge.bot["user_id"], POLL_END), 40, "poll end")
    assert ended[0]["origin_server_ts"] >= question["origin_server_ts"] + 5000
    edits = [e for e in await bot_events(alice, bridge.room_id, bridge.bot["user_id"], "m.room.message")
             if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert any("deadline passed" in e["content"]["m.new_content"]["body"] for e in edits)
    await late_answer_sent_while_down(bridge, alice, question)


async def late_answer_sent_while_down(bridge: Bridge, person: Person, question: dict[str, Any]) -> None:
    """A second after the deadline, while the bridge is down: refused as late when it starts again."""
    late = await person.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
    bridge.start()
    notice = await person.wait_notice(bridge.room_id, late, timeout=40)
    assert notice["content"][OUTCOME]["reason"] == "expired"
    await until(lambda: (record(bridge) or {}).get("state") == "expired", 30, "the expired record")
    assert "votes" in record(bridge) and record(bridge)["votes"] == []


@pytest.fixture(scope="module")
def plain_synapse(tmp_path_factory):
    """A homeserver without delayed events, as older ones are."""
    server = Synapse(tmp_path_factory.mktemp("no-delays"), delayed_events=False)
    server.start()
    yield server
    server.stop()


async def test_without_delayed_events_the_bridge_closes_at_start_what_expired_while_it_was_down(plain_synapse, tmp_path):
    synapse = plain_synapse
    bot = synapse.register(unique("askbot"))
    alice = Person(synapse, synapse.register(unique("alice")))
    room = synapse.create_room(bot["access_token"], invite=[alice.user_id])
    synapse.join(alice.token, room)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room, bot=bot)
    bridge.sets_root.mkdir()
    try:
        bridge.add_set(approval_set([alice.user_id], "6s", required=1))
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("ship", 1)]
        await polls(alice, room, timeout=5)
        bridge.kill()
        await asyncio.sleep(8)
        # Nothing closed it: the homeserver was not asked to.
        assert not await bot_events(alice, room, bot["user_id"], POLL_END)
        await late_answer_sent_while_down(bridge, alice, question)
        assert await until(lambda: bot_events(alice, room, bot["user_id"], POLL_END), 20, "the bridge's poll end")
        assert await until(lambda: _said(alice, bridge, "expired undecided"), 20, "the expiry notice")
    finally:
        bridge.kill()
        await alice.close()


async def test_two_of_three_with_a_veto_through_votes_a_stranger_and_kill_9(bridge, synapse):
    bob, carol, eve = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 3)
    try:
        await two_of_three(bridge, bridge.alice, bob, carol, eve)
    finally:
        for person in (bob, carol, eve):
            await person.close()


async def test_two_of_three_with_a_veto_in_appservice_mode(appservice_synapse, tmp_path):
    hs = appservice_synapse
    people = [Person(hs, hs.register(unique(name))) for name in ("alice", "bob", "carol", "eve")]
    bridge = appservice_storm_bridge(hs, tmp_path, people)
    try:
        await two_of_three(bridge, *people)
    finally:
        bridge.kill()
        for person in people:
            await person.close()


async def two_of_three(bridge: Bridge, alice: Person, bob: Person, carol: Person, eve: Person) -> None:
    """The scenario, in whichever mode ``bridge`` runs."""
    bot, room = bridge.bot["user_id"], bridge.room_id
    bridge.add_set(approval_set([alice.user_id, bob.user_id, carol.user_id], "10m"))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    poll = (await polls(alice, room, timeout=10))[question["event_id"]]
    # A stranger's vote: refused, naming who may answer.
    stranger = await eve.send(room, element_reply(question, "1", bot))
    refused = await eve.wait_notice(room, stranger, timeout=30)
    assert refused["content"][OUTCOME]["reason"] == "not_an_answerer"
    assert alice.user_id in refused["content"]["body"]
    # Alice votes "ship" in the poll, then takes it back (an empty vote) while the bridge is killed.
    first = await alice.send(room, vote(poll["event_id"], ["ship"]), "org.matrix.msc3381.poll.response")
    await alice.wait_notice(room, first, timeout=30)
    assert [v["sender"] for v in record(bridge)["votes"]] == [alice.user_id]
    bridge.kill()
    await alice.send(room, vote(poll["event_id"], []), "org.matrix.msc3381.poll.response")
    # Bob replies "ship"; the bridge reads both after its restart.
    bobs = await bob.send(room, element_reply(question, "1", bot))
    bridge.start()
    await bob.wait_notice(room, bobs, timeout=60)
    pending = await until(lambda: [v["sender"] for v in (record(bridge) or {}).get("votes", [])]
                          == [bob.user_id] and record(bridge), 30, "bob's vote alone (alice's taken back)")
    assert pending["state"] == "pending" and pending["required"] == 2
    bridge.kill()  # Bob changes his vote to the veto while the bridge is down
    edited = await bob.send(room, element_edit(bobs, "2"))
    bridge.start()
    await bob.wait_notice(room, edited, timeout=60)
    decided = await until(lambda: (record(bridge) or {}).get("decided_by") and record(bridge), 30, "the veto")
    assert decided["state"] == "answered" and decided["choice"] == "hold" and decided["decided_by"] == [bob.user_id]
    assert await until(lambda: _said(alice, bridge, "a veto by " + bob.user_id), 20, "the decision notice")
    # After the decision: Carol's vote is recorded, the decision stands.
    late = await carol.send(room, element_reply(question, "1", bot))
    told = await carol.wait_notice(room, late, timeout=30)
    assert "does not change the decision" in told["content"]["body"]
    assert record(bridge)["choice"] == "hold" and record(bridge)["decided_by"] == [bob.user_id]
    assert await until(lambda: bot_events(alice, room, bot, POLL_END), 20, "the poll end")


async def test_in_an_encrypted_room_the_homeservers_closing_is_encrypted_and_a_vote_counts(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.add_set(approval_set([alice.user_id], "8s", required=1))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    # A vote is judged and told as anywhere: one person decides a quorum of one.
    voted = await alice.send(room, element_reply(question, "2", bridge.bot["user_id"]))  # the veto
    await alice.wait_notice(room, voted, timeout=30)
    decided = await until(lambda: (record(bridge) or {}).get("decided_by") and record(bridge), 30, "the decision")
    assert decided["choice"] == "hold" and decided["decided_by"] == [alice.user_id]
    assert await until(lambda: _said(alice, bridge, "a veto by " + alice.user_id), 20, "the decision notice")
    # The delayed closing (scheduled encrypted) was cancelled: after the deadline no "deadline passed" edit came.
    await asyncio.sleep(10)
    sent = [e for e in await alice.wire(room) if e["sender"] == bridge.bot["user_id"] and "state_key" not in e]
    assert sent and all(e["type"] == "m.room.encrypted" for e in sent)
    edits = [e for e in await alice.messages(room) if e["sender"] == bridge.bot["user_id"]
             and e.get("content", {}).get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert edits and not any("deadline passed" in e["content"]["m.new_content"]["body"] for e in edits)


async def test_in_an_encrypted_room_the_homeserver_closes_it_encrypted_while_the_bridge_is_down(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.add_set(approval_set([alice.user_id], "6s", required=1))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    await polls(alice, room, timeout=10)
    bridge.kill()

    async def closing_edit() -> dict[str, Any] | None:
        for event in await alice.messages(room):
            content = event.get("content", {})
            if event["sender"] == bridge.bot["user_id"] and content.get("m.relates_to", {}).get("rel_type") \
                    == "m.replace" and "deadline passed" in content.get("m.new_content", {}).get("body", ""):
                return event
        return None

    edit = await until(closing_edit, 40, "the homeserver's closing edit, decrypted")
    assert edit["origin_server_ts"] >= question["origin_server_ts"] + 5000
    wire = {e["event_id"]: e for e in await alice.wire(room)}
    assert wire[edit["event_id"]]["type"] == "m.room.encrypted"


async def test_an_agents_mcp_wait_and_http_long_poll_both_return_expired(bridge):
    import aiohttp
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from helpers.agents import auth, start, structured, wait_listener

    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("gate")
    qset = {**approval_set([bridge.alice.user_id, "@absent:localhost"], "8s"), "id": set_id}
    async with aiohttp.ClientSession(headers=auth("planner")) as web:
        async with web.put(f"{base}/v1/sets/{set_id}", json=qset) as response:
            assert response.status == 201, await response.text()

        async def long_poll() -> tuple[float, dict[str, Any], str]:
            async with web.get(f"{base}/v1/sets/{set_id}/answers",
                               params={"wait": "answered", "question": "ship", "timeout": "60"}) as response:
                assert response.status == 200
                return time.monotonic(), await response.json(), response.headers["Askwright-Wait"]

        async def mcp_wait() -> tuple[float, dict[str, Any]]:
            http = httpx2.AsyncClient(headers=auth("planner"), timeout=httpx2.Timeout(30, read=120))
            async with Client(streamable_http_client(base + "/mcp", http_client=http)) as client:
                waited = structured(await client.call_tool("wait", {"set_id": set_id, "question": "ship",
                                                                    "timeout": 60}))
                return time.monotonic(), waited

        started_at = time.monotonic()
        (polled_at, view, header), (waited_at, waited) = await asyncio.gather(long_poll(), mcp_wait())
    assert header == "arrived" and waited["arrived"] is True
    for entry in (view["answers"][0], waited["answers"]["answers"][0]):
        assert entry["qid"] == "ship" and entry["state"] == "expired" and "choice" not in entry
    # Both came back with the expiry, long before their own timeouts, and close together.
    assert polled_at - started_at < 50 and waited_at - started_at < 50 and abs(polled_at - waited_at) < 10
