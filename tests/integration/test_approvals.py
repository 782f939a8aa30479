"""Approvals against a real Synapse (PROTOCOL 2a): a deadline kept with the
bridge running and while it is down (the homeserver's own delayed poll end
and a closing edit saying what stood, or, without delayed events, the
bridge's at its next start), an answer a
second late refused in both cases, and a 2-of-3 approval with a veto through
votes, a changed vote, a withdrawn vote, a stranger and a kill -9 before every
step, in both modes and encrypted; an escalation kept by the homeserver."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bridge.agents.owner import OWNER_FILE
from bridge.devserver import Synapse
from bridge.protocol.deadline import clock_words, event_time_ms
from helpers.agents import SECRETS, Receiver, agents_config, free_port
from helpers.attack import appservice_storm_bridge
from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson
from helpers.e2e_storm import StormingPerson
from helpers.harness import Bridge, Person, store_rows, unique
from helpers.waiting import until
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


def edit_time(question: dict[str, Any]) -> str:
    """The question's deadline as its closing words give it ("23:41:07 UTC")."""
    return clock_words(event_time_ms(question["content"]["question"]["expires"]) or 0)


def record(bridge: Bridge) -> dict[str, Any] | None:
    return bridge.answers("release")["answers"].get("ship")


until = partial(until, every=0.2)  # the homeserver is asked each time: not too often


async def poll_of(person: Person, room: str, question: dict[str, Any]) -> dict[str, Any]:
    """The question's poll, once the bridge has posted it (``polls`` waits for five)."""
    async def found() -> dict[str, Any] | None:
        return (await polls(person, room, timeout=0)).get(question["event_id"])
    return await until(found, 30, "the question's poll")


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
        assert f"1 of the 2 votes needed ({SHIP}: {alice.user_id})" in told
        await asyncio.sleep(1)
        await late_answer_is_refused(bridge, bob, question)
        # Asked by name, each answerer is notified of the question, and of nothing else the bridge
        # sent: not its poll's end, not its closing edit, though they name them.
        for person in (alice, bob):
            assert await highlights(synapse, person, bridge.room_id) == [question["event_id"]], person.user_id
    finally:
        await bob.close()


async def test_votes_placed_in_time_while_the_bridge_is_frozen_across_the_deadline_decide_it_in_the_room(bridge,
                                                                                                         synapse):
    """SIGSTOP before both votes, SIGCONT after the deadline: the bridge wakes
    to a deadline passed by its clock and to the votes not read yet.  The
    room may hear "expired" first, but the votes the room placed in time
    decide it, and the room and the agent hear that (they heard "expired"
    for good: the pass stopped watching the question while telling it)."""
    alice = bridge.alice
    (bob,) = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 1)
    receiver = Receiver(SECRETS["planner"])
    await receiver.start()
    bridge.extra_config = {**bridge.extra_config, **agents_config(free_port(), webhook_urls={"planner": receiver.url})}
    (bridge.add_set(approval_set([alice.user_id, bob.user_id], "12s")) / OWNER_FILE).write_text(
        json.dumps({"agent": "planner"}))
    try:
        bridge.start()
        question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
        await poll_of(alice, bridge.room_id, question)
        expires = event_time_ms(question["content"]["question"]["expires"]) or 0
        bridge.process.send_signal(signal.SIGSTOP)
        for person in (alice, bob):
            await person.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
        assert time.time() * 1000 < expires - 1000, "the votes were not sent in time"
        await asyncio.sleep(expires / 1000 - time.time() + 3)
        bridge.process.send_signal(signal.SIGCONT)

        async def told_decided() -> list[str] | None:
            edits = [e["content"]["m.new_content"]["body"] for e in
                     await bot_events(alice, bridge.room_id, bridge.bot["user_id"], "m.room.message")
                     if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"]
            hooks = [t["body"]["type"] for t in receiver.taken]
            return edits if edits and "decided: \u201cShip it" in edits[-1] and "question.decided" in hooks else None
        await until(told_decided, 40, "the room and the agent told of the decision")
        assert record(bridge)["decided_by"] == [alice.user_id, bob.user_id]
        notices = [e["content"]["body"] for e in await bot_events(alice, bridge.room_id, bridge.bot["user_id"],
                                                                  "m.room.message")
                   if "dev.superpipeline.question.approval" in e["content"]]
        assert notices[-1].startswith("Decided: \u201cShip it to production\u201d"), notices
    finally:
        if bridge.process is not None and bridge.process.poll() is None:
            bridge.process.send_signal(signal.SIGCONT)
        await bob.close()
        await receiver.close()


async def highlights(synapse: Synapse, person: Person, room: str) -> list[str]:
    """The events of ``room`` the homeserver highlighted for ``person`` (their push rules' verdict)."""
    from bridge.devserver import _http_json

    found = await asyncio.to_thread(_http_json, "GET", f"{synapse.url}/_matrix/client/v3/notifications?limit=100",
                                    None, person.token)
    return [n["event"]["event_id"] for n in reversed(found["notifications"]) if n["room_id"] == room and any(
        isinstance(a, dict) and a.get("set_tweak") == "highlight" and a.get("value", True) for a in n["actions"])]


async def _said(person: Person, bridge: Bridge, words: str) -> str | None:
    for event in await bot_events(person, bridge.room_id, bridge.bot["user_id"], "m.room.message"):
        body = event["content"].get("body", "")
        if words in body:
            return body
    return None


async def test_a_deadline_while_the_bridge_is_down_is_kept_by_the_homeserver_saying_what_stood(bridge, synapse):
    alice = bridge.alice
    bob, = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 1)
    try:
        bridge.add_set(approval_set([alice.user_id, bob.user_id], "12s"))
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("ship", 1)]
        await poll_of(alice, bridge.room_id, question)
        voted = await alice.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
        await alice.wait_notice(bridge.room_id, voted)
        # The bridge restates the closing edit it handed the homeserver: one vote stands now.
        await until(lambda: any("1 of the 2" in value for value, in store_rows(
            bridge.store_path, "SELECT value FROM meta WHERE key LIKE 'approval_closing:%'")), 20, "the restated edit")
        bridge.kill()  # kill -9, one vote standing
        # The homeserver ends the poll and edits the question itself, on time, saying what stood.
        ended = await until(lambda: bot_events(alice, bridge.room_id, bridge.bot["user_id"], POLL_END), 40,
                            "poll end")
        assert ended[0]["origin_server_ts"] >= question["origin_server_ts"] + 11000
        await asyncio.sleep(1)
        edits = [e["content"]["m.new_content"]["body"].rsplit("\n", 1)[-1]
                 for e in await bot_events(alice, bridge.room_id, bridge.bot["user_id"], "m.room.message")
                 if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"]
        # One closing edit: the first one scheduled (no votes) was cancelled when the vote came.
        assert edits == ["Closed: no longer accepting answers (expired undecided at "
                         f"{edit_time(question)}: 1 of the 2 votes needed ({SHIP}: {alice.user_id}))."]
        await late_answer_sent_while_down(bridge, bob, question, votes=[alice.user_id])
    finally:
        await bob.close()


async def late_answer_sent_while_down(bridge: Bridge, person: Person, question: dict[str, Any],
                                      votes: list[str] = ()) -> None:
    """A second after the deadline, while the bridge is down: refused as late when it starts again."""
    late = await person.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
    bridge.start()
    notice = await person.wait_notice(bridge.room_id, late, timeout=40)
    assert notice["content"][OUTCOME]["reason"] == "expired"
    await until(lambda: (record(bridge) or {}).get("state") == "expired", 30, "the expired record")
    assert [v["sender"] for v in record(bridge)["votes"]] == list(votes)


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
        await poll_of(alice, room, question)
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


# -- a 2-of-3 approval with a veto, step by step, through a kill -9 before every step ----------

WITHDRAWN = "dev.superpipeline.question.withdrawn"
SHIP, HOLD = "\u201cShip it to production\u201d", "\u201cHold it for a week\u201d"


class Approval:
    """One run of the scenario: the bridge, the people (three answerers and a
    stranger), the agent's webhook receiver, and what each step must leave."""

    def __init__(self, bridge: Bridge, people: list[Person], receiver: Receiver):
        self.bridge, self.receiver = bridge, receiver
        self.ana, self.bo, self.cy, self.eve = people
        self.room, self.bot = bridge.room_id, bridge.bot["user_id"]
        self.hooks: dict[str, tuple[str | None, list[tuple[str, str]]]] = {}  # key -> (state, votes) expected
        self.quiet: list[tuple[Person, str]] = []  # events that must never get a word back

    def who(self, *people: Person) -> list[str]:
        return [p.user_id for p in people]

    async def word_back(self, person: Person, event_id: str, timeout: float = 60) -> dict[str, Any]:
        """The bridge's word back on ``event_id``: its acknowledgement, refusal or withdrawal notice."""
        async def found() -> dict[str, Any] | None:
            for event in await person.messages(self.room):
                content = event.get("content", {})
                if event["sender"] == self.bot and (content.get(OUTCOME, {}).get("answer_event_id") == event_id
                                                    or content.get(WITHDRAWN, {}).get("event_id") == event_id):
                    return event
            return None
        return await until(found, timeout, f"the word back on {event_id}")

    async def stands(self, state: str | None, votes: list[tuple[Person, str]], **decided: Any) -> dict[str, Any] | None:
        """answers.json holds ``state`` with exactly ``votes`` standing (and the decision, if any)."""
        want = [(p.user_id, choice) for p, choice in votes]

        def now() -> dict[str, Any] | None:
            found = record(self.bridge)
            if state is None:
                return {"gone": True} if found is None else None
            if found and found.get("state") == state and [(v["sender"], v["choice"]) for v in found.get("votes", [])] == want:
                return found
            return None
        try:
            found = await until(now, 30, f"the record {state} with {want}")
        except AssertionError:
            raise AssertionError(f"answers.json holds {record(self.bridge)}") from None
        if state is None:
            return None
        assert found["required"] == 2
        if decided:
            assert found["choice"] == decided["choice"] and found["decided_by"] == self.who(*decided["by"]), found
        else:
            assert "choice" not in found and "decided_by" not in found, found
        return found

    async def webhooks(self, *added: tuple[str, str | None, list[tuple[Person, str]]]) -> None:
        """Every webhook the agent should have by now (``added``: what this step adds, as key, state
        and the votes standing after it), each taken once; a delivery again (at least once) is the same event."""
        for key, state, votes in added:
            self.hooks[key] = (state, [(p.user_id, c) for p, c in votes])
        await self.receiver.wait_for(len(self.hooks), timeout=30)
        taken = {t["key"]: t["body"] for t in self.receiver.taken}
        assert set(taken) == set(self.hooks), (sorted(taken), sorted(self.hooks))
        for key, (state, votes) in self.hooks.items():
            body = taken[key]
            assert body["type"] == key.split(":", 1)[0] and body["id"] == key and body["qid"] == "ship"
            if body["type"] == "question.decided":
                assert body["state"] == "answered" and body["record"]["choice"] == state, body
                assert [(v["sender"], v["choice"]) for v in body["record"]["votes"]] == votes
                continue
            assert body["state"] == state and body["required"] == 2, body
            assert [(v["sender"], v["choice"]) for v in body["votes"]] == votes, body
        for attempt in self.receiver.attempts:  # nothing but these keys, and a key's body never changes
            assert attempt["good"] and attempt["body"] == taken[attempt["key"]]

    async def no_word_back_on_the_quiet(self) -> None:
        for person, event_id in self.quiet:
            assert not [e for e in await person.messages(self.room)
                        if e["sender"] == self.bot and e.get("content", {}).get(OUTCOME, {}).get("answer_event_id")
                        == event_id], f"a word back on {event_id}, which changes nothing"


async def approval_through_kills(bridge: Bridge, people: list[Person], *, by: str) -> None:
    """Three may answer, two must agree, "hold" is a veto.  ``by``: "veto" (Bo
    changes his vote to hold, then Cy votes after the decision) or "agreement"
    (Cy agrees with Bo, then Bo changes his to the veto after it).  Before
    every step but the first the bridge is killed with SIGKILL; every other
    step is sent while it is down (read at its start), the rest once it is
    started again; after each, the record, the word back and the webhooks."""
    receiver = Receiver(SECRETS["planner"])
    await receiver.start()
    bridge.extra_config = {**bridge.extra_config, **agents_config(free_port(), webhook_urls={"planner": receiver.url})}
    run = Approval(bridge, people, receiver)
    ana, bo, cy, eve, room, bot = run.ana, run.bo, run.cy, run.eve, run.room, run.bot
    folder = bridge.add_set(approval_set(run.who(ana, bo, cy), "10m"))
    (folder / OWNER_FILE).write_text(json.dumps({"agent": "planner"}))
    bridge.start()
    try:
        question = (await bridge.wait_questions(ana, 1, timeout=60))[("ship", 1)]
        poll = await poll_of(ana, room, question)
        q = question["event_id"]
        step = 0
        started = time.monotonic()

        async def between(act):
            """kill -9, then ``act`` while the bridge is down or right after it starts, in turn."""
            nonlocal step
            step += 1
            bridge.kill()
            if step % 2:
                sent = await act()
                bridge.start()
            else:
                bridge.start()
                sent = await act()
            return sent

        # 1. A stranger picks the veto: refused, naming who may answer; it decides nothing, no webhook.
        stranger = await eve.send(room, element_reply(question, "2", bot))
        told = await run.word_back(eve, stranger)
        assert told["content"][OUTCOME]["reason"] == "not_an_answerer"
        assert all(p in told["content"]["body"] for p in run.who(ana, bo, cy))
        await run.stands(None, [])
        # 2. Ana votes "ship" in the poll.
        first = await between(lambda: ana.send(room, vote(poll["event_id"], ["ship"]), "org.matrix.msc3381.poll.response"))
        told = await run.word_back(ana, first)
        assert f"1 of 2 for {SHIP} so far; waiting for {bo.user_id} or {cy.user_id}." in told["content"]["body"]
        await run.stands("pending", [(ana, "ship")])
        await run.webhooks((f"answer.accepted:{first}", "pending", [(ana, "ship")]))
        # 3. Ana takes it back (an empty poll vote): nothing stands.
        empty = await between(lambda: ana.send(room, vote(poll["event_id"], []), "org.matrix.msc3381.poll.response"))
        told = await run.word_back(ana, empty)
        assert "withdrawn" in told["content"]["body"] and "No votes stand yet; 2 must agree." in told["content"]["body"]
        await run.stands(None, [])
        await run.webhooks((f"answer.withdrawn:{empty}", None, []))
        # 4. Bo replies "ship".
        bos = await between(lambda: bo.send(room, element_reply(question, "1", bot)))
        told = await run.word_back(bo, bos)
        assert f"1 of 2 for {SHIP} so far; waiting for {ana.user_id} or {cy.user_id}." in told["content"]["body"]
        await run.stands("pending", [(bo, "ship")])
        await run.webhooks((f"answer.accepted:{bos}", "pending", [(bo, "ship")]))
        # 5. Cy "edits" Bo's vote into the veto: not Bo's edit, so ignored: no word back, no webhook.
        forged = await between(lambda: cy.send(room, element_edit(bos, "2")))
        run.quiet.append((cy, forged))
        await run.stands("pending", [(bo, "ship")])
        if by == "veto":
            # 6. Bo changes his vote to "hold": the veto decides at once.
            decider = await between(lambda: bo.send(room, element_edit(bos, "2")))
            told = await run.word_back(bo, decider)
            assert told["content"]["body"].endswith("With your veto it is decided.")
            await run.stands("answered", [(bo, "hold")], choice="hold", by=[bo])
            await run.webhooks((f"answer.accepted:{decider}", "answered", [(bo, "hold")]),
                               (f"question.decided:{q}", "hold", [(bo, "hold")]))
            decided, decided_by = "hold", [bo]
            # 7. Cy votes "ship" after the decision: recorded, the decision stands.
            after = await between(lambda: cy.send(room, element_reply(question, "1", bot)))
            told = await run.word_back(cy, after)
            after_votes = [(bo, "hold"), (cy, "ship")]
            # 8. Bo withdraws his deciding vote (a redaction): the decision stands still.
            redacted, left = bos, [(cy, "ship")]
            redactor = bo
        else:
            # 6. Cy replies "ship": two agree.
            decider = await between(lambda: cy.send(room, element_reply(question, "1", bot)))
            told = await run.word_back(cy, decider)
            assert told["content"]["body"].endswith("With your vote it is decided.")
            await run.stands("answered", [(bo, "ship"), (cy, "ship")], choice="ship", by=[bo, cy])
            await run.webhooks((f"answer.accepted:{decider}", "answered", [(bo, "ship"), (cy, "ship")]),
                               (f"question.decided:{q}", "ship", [(bo, "ship"), (cy, "ship")]))
            decided, decided_by = "ship", [bo, cy]
            # 7. Bo changes his to the veto after the decision: recorded, the decision stands.
            after = await between(lambda: bo.send(room, element_edit(bos, "2")))
            told = await run.word_back(bo, after)
            after_votes = [(cy, "ship"), (bo, "hold")]  # in the room's order: his vote is his edit now
            # 8. Cy withdraws her deciding vote (a redaction): the decision stands still.
            redacted, left = decider, [(bo, "hold")]
            redactor = cy
        assert "Your vote is recorded; it does not change the decision." in told["content"]["body"], told
        await run.stands("answered", after_votes, choice=decided, by=decided_by)
        await run.webhooks((f"answer.accepted:{after}", "answered", after_votes))
        # The question says who decided, and its poll is ended.
        announced = (f"Vetoed: {HOLD} by {bo.user_id}." if by == "veto"
                     else f"Decided: {SHIP} by {bo.user_id} and {cy.user_id}.")
        assert await until(lambda: _said(ana, bridge, announced), 30, "the decision notice")
        assert await until(lambda: bot_events(ana, room, bot, POLL_END), 30, "the poll end")
        # The three were asked by name and are notified of the question; not again by the poll's end,
        # the closing edit or the announcement, which name them too.  (Encrypted, the homeserver
        # reads no content and leaves it to the clients.)
        if "encryption" not in bridge.extra_config:
            for person in (ana, bo, cy):
                assert await highlights(bridge.synapse, person, room) == [q], person.user_id

        async def redact() -> str:
            async with getattr(redactor, "lock", None) or contextlib.nullcontext():
                response = await redactor.client.room_redact(room, redacted)
            return response.event_id
        redaction = await between(redact)
        told = await run.word_back(redactor, redaction)
        assert "withdrawn" in told["content"]["body"] and "does not change the decision" in told["content"]["body"], told
        await run.stands("answered", left, choice=decided, by=decided_by)
        await run.webhooks((f"answer.withdrawn:{redaction}", "answered", left))
        # Once more at the end, after a pause: no webhook nor word back came that should not have.
        await asyncio.sleep(2)
        await run.webhooks()
        await run.no_word_back_on_the_quiet()
        assert bridge.starts == 8
        print(f"approval by {by}: 7 kills, {time.monotonic() - started:.1f} s")
    finally:
        bridge.kill()
        await receiver.close()


async def test_two_of_three_with_a_veto_in_bot_mode(bridge, synapse):
    people = [bridge.alice, *await joined(synapse, bridge.room_id, bridge.bot["access_token"], 3)]
    try:
        await approval_through_kills(bridge, people, by="veto")
    finally:
        for person in people[1:]:
            await person.close()


async def test_two_of_three_by_agreement_in_appservice_mode(appservice_synapse, tmp_path):
    hs = appservice_synapse
    people = [Person(hs, hs.register(unique(name))) for name in ("ana", "bo", "cy", "eve")]
    bridge = appservice_storm_bridge(hs, tmp_path, people)
    try:
        await approval_through_kills(bridge, people, by="agreement")
    finally:
        for person in people:
            await person.close()


async def vote_before_leaving_while_down(bridge: Bridge, synapse: Synapse, people: list[Person]) -> None:
    """The room's members are judged as the timeline has them at each vote:
    a voter who was a member when they voted, and left while the bridge was
    down, still voted (the bridge running would have counted it)."""
    ana, bo, cy = people
    bridge.add_set(approval_set([ana.user_id, bo.user_id, cy.user_id], "10m"))
    bridge.start()
    question = (await bridge.wait_questions(ana, 1, timeout=60))[("ship", 1)]
    poll = await poll_of(ana, bridge.room_id, question)
    bridge.kill()
    await bo.send(bridge.room_id, vote(poll["event_id"], ["ship"]), "org.matrix.msc3381.poll.response")
    await bo.client.room_leave(bridge.room_id)
    await cy.send(bridge.room_id, vote(poll["event_id"], ["ship"]), "org.matrix.msc3381.poll.response")
    bridge.start()

    async def decided() -> dict[str, Any] | None:
        found = record(bridge)
        return found if found and found.get("state") == "answered" else None
    found = await until(decided, 40, "the question decided by both votes")
    assert (found["choice"], found["decided_by"]) == ("ship", [bo.user_id, cy.user_id])
    assert "sender_not_allowed" not in {row[0] for row in store_rows(bridge.store_path,
                                                                     "SELECT reason FROM answer_log")}


async def test_a_vote_placed_before_its_voter_left_counts_though_the_bridge_read_it_after(bridge, synapse):
    people = [bridge.alice, *await joined(synapse, bridge.room_id, bridge.bot["access_token"], 2)]
    try:
        await vote_before_leaving_while_down(bridge, synapse, people)
    finally:
        for person in people[1:]:
            await person.close()


async def test_a_vote_placed_before_its_voter_left_counts_in_appservice_mode_too(appservice_synapse, tmp_path):
    hs = appservice_synapse
    people = [Person(hs, hs.register(unique(name))) for name in ("ana", "bo", "cy")]
    bridge = appservice_storm_bridge(hs, tmp_path, people)
    try:
        await vote_before_leaving_while_down(bridge, hs, people)
    finally:
        bridge.kill()
        for person in people:
            await person.close()


async def encrypting_people(synapse: Synapse, tmp_path: Path) -> list[StormingPerson]:
    """Four people on encrypting clients that stay open (they answer the bridge's
    requests for a room key it missed while it was down, as current clients do)."""
    people = [StormingPerson(synapse, synapse.register(unique(name)), tmp_path / f"keys-{name}", rotate_every=10**6)
              for name in ("ana", "bo", "cy", "eve")]
    for person in people:
        person.sends = 1  # no session's key held back: each is shared with its first message
        await person.cross_sign()  # trust: cross-signed, the default
    return people


@pytest.mark.parametrize("mode", ["bot", "appservice"])
async def test_two_of_three_in_an_encrypted_room(mode, request, tmp_path):
    synapse = request.getfixturevalue("appservice_synapse" if mode == "appservice" else "synapse")
    people = await encrypting_people(synapse, tmp_path)
    workdir = tmp_path / "bridge"
    workdir.mkdir()
    if mode == "appservice":
        bridge = appservice_storm_bridge(synapse, workdir, people, initial_state=[ENCRYPTION_STATE])
    else:
        bot = synapse.register(unique("askbot"))
        room_id = synapse.create_room(bot["access_token"], invite=[p.user_id for p in people],
                                      initial_state=[ENCRYPTION_STATE])
        for person in people:
            synapse.join(person.token, room_id)
        bridge = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot=bot)
        bridge.sets_root.mkdir()
    bridge.extra_config["encryption"] = {"grace": "2m"}
    stop = asyncio.Event()
    attending = [asyncio.create_task(p.attend(stop)) for p in people]
    try:
        # The veto in bot mode, the agreement through the appservice: both paths, encrypted.
        await approval_through_kills(bridge, people, by="veto" if mode == "bot" else "agreement")
        wire = [e for e in await people[0].wire(bridge.room_id) if e["sender"] == bridge.bot["user_id"]
                and "state_key" not in e]
        assert wire and all(e["type"] == "m.room.encrypted" for e in wire)
    finally:
        stop.set()
        await asyncio.gather(*attending, return_exceptions=True)
        for person in people:
            await person.close()


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
    assert await until(lambda: _said(alice, bridge, f"Vetoed: {HOLD} by {alice.user_id}."), 20, "the decision notice")
    # The delayed closing (scheduled encrypted) was cancelled: after the deadline no "expired" edit came.
    await asyncio.sleep(10)
    sent = [e for e in await alice.wire(room) if e["sender"] == bridge.bot["user_id"] and "state_key" not in e]
    assert sent and all(e["type"] == "m.room.encrypted" for e in sent)
    edits = [e for e in await alice.messages(room) if e["sender"] == bridge.bot["user_id"]
             and e.get("content", {}).get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert edits and not any("expired undecided" in e["content"]["m.new_content"]["body"] for e in edits)


@pytest.mark.parametrize("encrypted", ["bot", "appservice"], indirect=True)
async def test_someone_joining_after_the_closing_was_scheduled_reads_it_and_it_says_the_vote(encrypted, tmp_path):  # noqa: F811
    """Bob joins the encrypted room after the homeserver was handed the
    question's poll end and closing edit; then Alice votes.  Those were
    encrypted under the room key of before, which Bob never got: his client
    showed the question open for good.  And his join threw the room key
    away, so the closing edit could not be said again with the vote: the
    homeserver closed it "no votes" while the room had been told "1 of 2"."""
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    synapse, bot = bridge.synapse, bridge.bot["user_id"]
    bridge.add_set(approval_set([alice.user_id, "@absent:localhost"], "30s"))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    poll = await poll_of(alice, room, question)
    await until(lambda: "delayed edit for" in bridge.log_text(), 20, "the closing handed to the homeserver")
    bob = EncryptingPerson(synapse, synapse.register(unique("bob")), tmp_path / "bob-keys")
    try:
        synapse.invite(bridge.bot["access_token"] or alice.token, room, bob.user_id)
        synapse.join(bob.token, room)
        await bob.cross_sign()
        joined_at = int(time.time() * 1000)
        await asyncio.sleep(2)
        await alice.send(room, vote(poll["event_id"], ["ship"]), "org.matrix.msc3381.poll.response")
        counted = await until(lambda: (record(bridge) or {}).get("votes"), 30, "the vote")
        assert [(v["sender"], v["choice"]) for v in counted] == [(alice.user_id, "ship")]
        await until(lambda: (record(bridge) or {}).get("state") == "expired", 60, "the deadline")
        await asyncio.sleep(3)  # the homeserver's delayed events go out at it
        for person in (alice, bob):
            await person.keep_up()
        unreadable = [e["event_id"] for e in await bob.messages(room) if e["sender"] == bot
                      and e["type"] == "m.room.encrypted" and e["origin_server_ts"] >= joined_at]
        assert unreadable == [], "what the bridge (or the homeserver for it) sent after Bob joined, he can't read"
        bob_saw = [e["type"] for e in await bob.messages(room) if e["sender"] == bot and e["origin_server_ts"] >= joined_at]
        assert "org.matrix.msc3381.poll.end" in bob_saw, bob_saw
        edits = [e["content"]["m.new_content"]["body"] for e in await alice.messages(room) if e["sender"] == bot
                 and e.get("content", {}).get("m.relates_to", {}).get("rel_type") == "m.replace"]
        assert edits and "no votes" not in edits[-1] and "1 of the 2" in edits[-1], edits
    finally:
        await bob.close()


async def test_in_an_encrypted_room_the_homeserver_closes_it_encrypted_while_the_bridge_is_down(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.add_set(approval_set([alice.user_id, "@absent:localhost"], "15s"))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    await poll_of(alice, room, question)
    voted = await alice.send(room, element_reply(question, "1", bridge.bot["user_id"]))
    await alice.wait_notice(room, voted, timeout=30)
    # The encrypted closing edit is restated (one vote stands) before the bridge is killed.
    await until(lambda: any("1 of the 2" in value for value, in store_rows(
        bridge.store_path, "SELECT value FROM meta WHERE key LIKE 'approval_closing:%'")), 20, "the restated edit")
    bridge.kill()

    async def closing_edit() -> dict[str, Any] | None:
        for event in await alice.messages(room):
            content = event.get("content", {})
            if event["sender"] == bridge.bot["user_id"] and content.get("m.relates_to", {}).get("rel_type") \
                    == "m.replace" and "expired undecided at" in content.get("m.new_content", {}).get("body", ""):
                return event
        return None

    edit = await until(closing_edit, 40, "the homeserver's closing edit, decrypted")
    assert edit["origin_server_ts"] >= question["origin_server_ts"] + 14000
    assert edit["content"]["m.new_content"]["body"].endswith(
        f"expired undecided at {edit_time(question)}: 1 of the 2 votes needed ({SHIP}: {alice.user_id})).")
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

        async def cli_wait() -> tuple[float, int, dict[str, Any]]:
            # The command an agent on the bridge's machine runs, on the set's folder.
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bridge", "wait", str(bridge.sets_root / set_id), "--question", "ship",
                "--timeout", "60", stdout=asyncio.subprocess.PIPE)
            out, _ = await process.communicate()
            return time.monotonic(), process.returncode, json.loads(out)

        started_at = time.monotonic()
        (polled_at, view, header), (waited_at, waited), (cli_at, code, printed) = await asyncio.gather(
            long_poll(), mcp_wait(), cli_wait())
    assert header == "arrived" and waited["arrived"] is True
    assert code == 4  # PROTOCOL 2a: an awaited question expired undecided
    printed_entry = next(e for e in printed["answers"] if e["qid"] == "ship")
    for entry in (view["answers"][0], waited["answers"]["answers"][0], printed_entry):
        assert entry["qid"] == "ship" and entry["state"] == "expired" and "choice" not in entry
    # All three came back with the expiry, long before their own timeouts, and close together.
    ends = (polled_at, waited_at, cli_at)
    assert max(ends) - started_at < 50 and max(ends) - min(ends) < 10


async def test_an_escalation_mentions_its_people_on_time_while_the_bridge_is_down_and_they_may_answer(bridge, synapse):
    alice, room, bot = bridge.alice, bridge.room_id, bridge.bot["user_id"]
    bob, = await joined(synapse, room, bridge.bot["access_token"], 1)
    try:
        qset = approval_set([alice.user_id], "10m", required=1)
        qset["questions"][0]["escalate"] = {"after": "8s", "to": [bob.user_id]}
        bridge.add_set(qset)
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("ship", 1)]
        assert f"{bob.user_id} will be asked too" in question["content"]["body"]
        # Before the escalation Bob may not answer.
        early = await bob.send(room, element_reply(question, "1", bot))
        refused = await bob.wait_notice(room, early, timeout=30)
        assert refused["content"][OUTCOME]["reason"] == "not_an_answerer"
        await until(lambda: store_rows(bridge.store_path, "SELECT 1 FROM meta WHERE key LIKE 'escalated:%'"), 20,
                    "the escalation handed to the homeserver")
        bridge.kill()  # the homeserver mentions him on time by itself

        async def mention() -> dict[str, Any] | None:
            for event in await bot_events(bob, room, bot, "m.room.message"):
                content = event["content"]
                if content.get("m.mentions", {}).get("user_ids") == [bob.user_id]:
                    return event
            return None
        told = await until(mention, 40, "the escalation's mention")
        assert told["origin_server_ts"] >= question["origin_server_ts"] + 7000
        assert told["content"]["body"] == f"{bob.user_id}: \u201cShip 2.4\u201d is still undecided; you may answer it now."
        assert told["content"]["m.relates_to"]["rel_type"] == "m.thread"
        assert told["content"]["m.relates_to"]["event_id"] == question["event_id"]
        # From then on he may answer: his veto decides (the bridge reads it when it starts).
        vetoed = await bob.send(room, element_reply(question, "2", bot))
        bridge.start()
        ack = await bob.wait_notice(room, vetoed, timeout=60)
        assert ack["content"]["body"].endswith("With your veto it is decided.")
        decided = await until(lambda: (record(bridge) or {}).get("decided_by") and record(bridge), 30, "the decision")
        assert decided["choice"] == "hold" and decided["decided_by"] == [bob.user_id]
    finally:
        await bob.close()


async def stray_closing_edit_is_cancelled(bridge: Bridge, alice: Person, bob: Person) -> None:
    """The store lost the delay id of the closing edit it handed the
    homeserver (killed before writing it down, and down longer than Synapse
    remembers the transaction).  At the next start the bridge reads the
    homeserver's scheduled events and cancels the one it does not hold: the
    question, decided meanwhile, is never edited to "expired" at its deadline."""
    import sqlite3

    bridge.add_set(approval_set([alice.user_id, bob.user_id], "25s"))
    bridge.start()
    question = (await bridge.wait_questions(alice, 1, timeout=60))[("ship", 1)]
    await poll_of(alice, bridge.room_id, question)
    key = f"delays:{question['event_id']}"
    await until(lambda: any("edit" in json.loads(v) for v, in store_rows(
        bridge.store_path, "SELECT value FROM meta WHERE key=?", key)), 20, "the delayed closing edit")
    bridge.kill()
    db = sqlite3.connect(bridge.store_path)
    with db:
        (value,) = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        delays = json.loads(value)
        delays.pop("edit")  # the lost window: the homeserver holds it, the store does not know its id
        db.execute("UPDATE meta SET value=? WHERE key=?", (json.dumps(delays), key))
    db.close()
    bridge.start()
    await until(lambda: "stray delayed" in bridge.log_text(), 30, "the sweep")
    for person in (alice, bob):
        await person.send(bridge.room_id, element_reply(question, "1", bridge.bot["user_id"]))
    await until(lambda: (record(bridge) or {}).get("state") == "answered", 30, "the decision")
    # Past the deadline, with time for the homeserver to have sent it: no closing edit says "expired".
    expires = event_time_ms(question["content"]["question"]["expires"]) or 0
    await asyncio.sleep(max(0.0, expires / 1000 - time.time()) + 3)
    closing = [e["content"]["m.new_content"]["body"].rsplit("\n", 1)[-1]
               for e in await bot_events(alice, bridge.room_id, bridge.bot["user_id"], "m.room.message")
               if e["content"].get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert closing and all("expired" not in line for line in closing), closing
    assert any("decided" in line for line in closing)


async def test_a_stray_closing_edit_the_store_lost_is_cancelled_at_start_in_bot_mode(bridge, synapse):
    bob, = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 1)
    try:
        await stray_closing_edit_is_cancelled(bridge, bridge.alice, bob)
    finally:
        await bob.close()


async def test_a_stray_closing_edit_the_store_lost_is_cancelled_at_start_in_appservice_mode(appservice_synapse,
                                                                                          tmp_path):
    """The appservice's delayed events are its bot's (the as_token, no user_id): listed and cancelled as the bot."""
    hs = appservice_synapse
    people = [Person(hs, hs.register(unique(name))) for name in ("ana", "bo")]
    bridge = appservice_storm_bridge(hs, tmp_path, people)
    try:
        await stray_closing_edit_is_cancelled(bridge, *people)
    finally:
        bridge.kill()
        for person in people:
            await person.close()


async def test_a_set_whose_fixed_deadline_passed_still_takes_new_questions(bridge):
    # An RFC 3339 expires, once passed, made the poster's lint refuse the
    # whole set ("is in the past") at every pass: a question added to it was
    # never posted, though the agents' API had answered 200 for it.
    from datetime import datetime, timedelta, timezone

    alice = bridge.alice
    at = (datetime.now(timezone.utc) + timedelta(seconds=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    qset = approval_set([alice.user_id], at, required=1)
    bridge.add_set(qset)
    bridge.start()
    await bridge.wait_questions(alice, 1)
    await until(lambda: (record(bridge) or {}).get("state") == "expired", 40, "the deadline passing")
    extra = {"id": "notes", "kind": "text", "title": "Anything else?", "question": "Anything else about 2.4?",
             "why": "The notes go out with the release.",
             "guess": {"text": "Nothing else.", "why": "It was a quiet cycle.", "confidence": "low"}}
    qset["questions"].append(extra)
    bridge.add_set(qset)
    found = await bridge.wait_questions(alice, 2, timeout=30)
    assert ("notes", 1) in found
    assert "fails lint" not in bridge.log_text()


async def test_a_blind_compare_decided_by_a_quorum_never_names_the_take_behind_a_side(bridge, synapse):
    """Sides randomized, so nobody knows which take is which: the message and
    the poll say "Left"/"Right", but the word back said "1 of 2 for “Take 5”",
    and the decision, the poll's end and the closing edit named it too."""
    alice = bridge.alice
    bob, = await joined(synapse, bridge.room_id, bridge.bot["access_token"], 1)
    try:
        bridge.add_set({"askwright": 1, "id": "intro", "title": "Intro", "questions": [{
            "id": "takes", "kind": "compare", "title": "Intro take", "question": "Which take should open the video?",
            "why": "Only one intro fits.", "look_for": ["Whether the voice stays level"],
            "sides": {"left": "t2", "right": "t5", "randomized": True},
            "options": [{"id": "t2", "label": "Take 2 (the loud one)"}, {"id": "t5", "label": "Take 5 (the quiet one)"}],
            "guess": {"option": "t5", "why": "It is calmer.", "confidence": "low"},
            "answerers": [alice.user_id, bob.user_id], "quorum": {"required": 2}}]})
        bridge.start()
        question = (await bridge.wait_questions(alice, 1))[("takes", 1)]
        shown = question["content"]["body"]
        right = 2 if shown.index("Right") > shown.index("Left") else 1  # the number the message gave "Right"
        first = await alice.send(bridge.room_id, element_reply(question, str(right), bridge.bot["user_id"]))
        ack = (await alice.wait_notice(bridge.room_id, first))["content"]
        assert "1 of 2 for \u201cRight\u201d so far" in ack["body"], ack["body"]
        second = await bob.send(bridge.room_id, element_reply(question, str(right), bridge.bot["user_id"]))
        await bob.wait_notice(bridge.room_id, second)
        assert bridge.answers("intro")["answers"]["takes"]["decided_by"] == [alice.user_id, bob.user_id]
        decided = await until(lambda: _said(alice, bridge, "Decided"), 20, "the decision in the thread")
        assert "Right" in decided, decided
        await asyncio.sleep(2)  # the poll's end and the closing edit
        said = [(e["type"], e["content"]) for e in await alice.messages(bridge.room_id)
                if e.get("sender") == bridge.bot["user_id"] and e["event_id"] != question["event_id"]]
        for kind, content in said:  # what a client shows of each: its text, an edit's new text
            shown = json.dumps([part.get(key) for part in (content, content.get("m.new_content") or {})
                                for key in ("body", "formatted_body", "org.matrix.msc1767.text", "m.text")],
                               ensure_ascii=False)
            assert "Take 5" not in shown and "Take 2" not in shown, (kind, shown)
    finally:
        await bob.close()
