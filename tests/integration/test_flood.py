"""One person floods the room while the homeserver keeps its default message
rate limit for the bridge's account (Synapse: 0.2/s, burst 10): another
person's acknowledgement does not wait behind the flood, and the flooder
gets a handful of replies, not one per message (issue 14)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import quote

from bridge.devserver import Synapse, _http_json
from helpers.harness import Bridge, Person, answer_content, store_rows, unique

JUNK = 60


def choice_set() -> dict:
    return {
        "askwright": 1, "id": "flood", "title": "Flood",
        "questions": [{"id": "pick", "kind": "choice", "title": "Pick one", "question": "Which one?",
                       "why": "It decides the next step.",
                       "options": [{"id": "a", "label": "Apples"}, {"id": "b", "label": "Pears"}],
                       "guess": {"option": "a", "why": "Usual.", "confidence": "high"}}],
    }


def unlimited(synapse: Synapse, admin_token: str, user_id: str) -> None:
    """Lift the rate limit for one account (the operators' own remedy, here for the people)."""
    _http_json("POST", f"{synapse.url}/_synapse/admin/v1/users/{quote(user_id)}/override_ratelimit",
               {"messages_per_second": 0, "burst_count": 0}, token=admin_token)


@contextlib.asynccontextmanager
async def flooded_room(tmp_path):
    """A Synapse of its own keeping the bridge's account to its default rate
    limit, a room with a flooder and Alice (their own limits lifted), and the
    bridge posting one choice question."""
    synapse = Synapse(tmp_path / "hs", extra_config={"rc_message": {"per_second": 0.2, "burst_count": 10}})
    synapse.start()
    people: list[Person] = []
    bridge = None
    try:
        admin = synapse.register(unique("admin"), admin=True)
        bot = synapse.register(unique("askbot"))
        flooder, alice = (Person(synapse, synapse.register(unique(name))) for name in ("flooder", "alice"))
        people += [flooder, alice]
        for person in people:
            unlimited(synapse, admin["access_token"], person.user_id)
        room = synapse.create_room(bot["access_token"], invite=[p.user_id for p in people])
        for person in people:
            synapse.join(person.token, room)
        bridge = Bridge(synapse=synapse, workdir=tmp_path / "bridge", room_id=room, bot=bot)
        bridge.workdir.mkdir()
        bridge.sets_root.mkdir()
        bridge.add_set(choice_set())
        bridge.start()
        question = (await bridge.wait_questions(alice, 1, timeout=60))[("pick", 1)]
        yield bridge, bot, flooder, alice, room, question
        bridge.check_alive()
    finally:
        if bridge is not None:
            bridge.kill()
        for person in people:
            await person.close()
        synapse.stop()


async def until_judged(bridge: Bridge, sender: str, outcome: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while store_rows(bridge.store_path, "SELECT COUNT(*) FROM answer_log WHERE sender=? AND outcome=?",
                     sender, outcome)[0][0] < count:
        bridge.check_alive()
        assert time.monotonic() < deadline, "the flood was not judged"
        await asyncio.sleep(0.2)


async def replies_to(person: Person, room: str, bot: dict, events: list[str]) -> list[dict]:
    return [e for e in await person.messages(room, limit=1000) if e.get("sender") == bot["user_id"]
            and e.get("content", {}).get("dev.superpipeline.question.outcome", {}).get("answer_event_id")
            in set(events)]


async def test_a_flood_of_junk_replies_does_not_delay_another_persons_acknowledgement(tmp_path):
    async with flooded_room(tmp_path) as (bridge, bot, flooder, alice, room, question):
        junk = []
        for n in range(JUNK):
            junk.append(await flooder.send(room, {
                "msgtype": "m.text", "body": f"> <{bot['user_id']}> Pick one\n\nblah {n} blah",
                "m.relates_to": {"m.in_reply_to": {"event_id": question["event_id"]}}}))
        await until_judged(bridge, flooder.user_id, "refused", JUNK)

        sent_at = time.monotonic()
        answer = await alice.send(room, answer_content(question, option_id="b"))
        notice = await alice.wait_notice(room, answer, timeout=30)
        waited = time.monotonic() - sent_at
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
        assert bridge.answers("flood")["answers"]["pick"]["choice"] == "b"

        replies = await replies_to(flooder, room, bot, junk)
        print(f"flood: acknowledgement after {waited:.1f} s; {len(replies)} replies to {JUNK} junk messages")
        assert 1 <= len(replies) <= 5, f"{len(replies)} replies to the flooder"


async def test_a_flood_of_notes_that_count_delays_no_one_elses_word_and_gets_a_handful_of_replies(tmp_path):
    # Notes in the question's thread are kept (each one a good message), and
    # each got a reply of its own, sent in the order they came: 30 of them
    # held Alice's acknowledgement back 109 s at the homeserver's pace.
    async with flooded_room(tmp_path) as (bridge, bot, flooder, alice, room, question):
        notes = []
        for n in range(30):
            notes.append(await flooder.send(room, {
                "msgtype": "m.text", "body": f"one more thing, number {n}",
                "m.relates_to": {"rel_type": "m.thread", "event_id": question["event_id"], "is_falling_back": True,
                                 "m.in_reply_to": {"event_id": question["event_id"]}}}))
        await until_judged(bridge, flooder.user_id, "annotated", 30)
        answer = await alice.send(room, answer_content(question, option_id="b"))
        notice = await alice.wait_notice(room, answer, timeout=30)
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
        note = bridge.answers("flood")["answers"]["pick"]
        assert note["choice"] == "b"
        await asyncio.sleep(5)  # what the flooder is told meanwhile
        replies = await replies_to(flooder, room, bot, notes)
        # The first go out one each while the homeserver's burst (10) lasts; the rest are told together.
        assert 1 <= len(replies) <= 12, f"{len(replies)} replies to 30 notes"
