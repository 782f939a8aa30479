"""Appservice mode against a real Synapse that loads the registration written
by ``generate-registration``: the homeserver pushes, the bridge answers 200
only once answers are durable, replays and crashes change nothing, and an
answer whose transaction never reaches the bridge still lands."""

from __future__ import annotations

import asyncio
import re
import stat
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from bridge.devserver import free_port
from helpers.attack import AS_BOT as BOT
from helpers.attack import AS_LOCALPART as LOCALPART
from helpers.attack import Relay, start_appservice_synapse
from helpers.harness import Bridge, answer_content, question_posts, read_set, store_rows, unique
from helpers.sets import ALL_KINDS_PICKS, all_kinds_set, check_all_kinds_read
from helpers.waiting import until

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8


@pytest.fixture(scope="module")
def synapse(tmp_path_factory):
    """A Synapse of its own, started with the registration the real command
    wrote; shadows the session's bot-mode homeserver for this module."""
    workdir = tmp_path_factory.mktemp("appservice")
    server = start_appservice_synapse(workdir, preamble="# the bridge's identity for these tests\n")
    config_path, registration = workdir / "config.yaml", workdir / "registration.yaml"
    settings = yaml.safe_load(config_path.read_text())["appservice"]
    written = yaml.safe_load(registration.read_text())
    assert config_path.read_text().startswith("# the bridge's identity"), "the text edit kept the comment"
    assert stat.S_IMODE(config_path.stat().st_mode) == stat.S_IMODE(registration.stat().st_mode) == 0o600
    assert len(settings["as_token"]) >= 64 and settings["as_token"] != settings["hs_token"]
    assert (written["as_token"], written["hs_token"]) == (settings["as_token"], settings["hs_token"])
    assert written["rate_limited"] is False and written["sender_localpart"] == LOCALPART
    yield server
    server.stop()


@pytest.fixture
async def bridge(synapse, tmp_path, person):
    """A room alice made and invited the bridge's user to; a bridge in
    appservice mode, not yet started."""
    alice = person()
    room_id = synapse.create_room(alice.token, invite=[BOT])
    env = Bridge(synapse=synapse, workdir=tmp_path, room_id=room_id, bot={"user_id": BOT, "access_token": None},
                 extra_config={"appservice": dict(synapse.appservice)})
    env.sets_root.mkdir()
    env.alice = alice
    yield env
    env.kill()


async def started(bridge: Bridge) -> dict[tuple[str, int], dict[str, Any]]:
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    return await bridge.wait_questions(bridge.alice, QUESTION_COUNT)


def endpoint(bridge: Bridge, path: str) -> str:
    return bridge.synapse.appservice["url"] + path


def fake_answer(bridge: Bridge, question: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An answer event as the homeserver would push it, never sent to the room."""
    return {"type": "m.room.message", "event_id": f"${uuid.uuid4().hex}", "room_id": bridge.room_id,
            "sender": bridge.alice.user_id, "origin_server_ts": int(time.time() * 1000),
            "content": answer_content(question, **fields), "unsigned": {"age": 1}}


def accepted_count(bridge: Bridge) -> int:
    return store_rows(bridge.store_path, "SELECT COUNT(*) FROM answer_log WHERE outcome='accepted'")[0][0]


async def test_every_kind_lands_as_in_bot_mode(bridge):
    questions = await started(bridge)
    assert len(questions) == QUESTION_COUNT
    for question in questions.values():
        assert question["sender"] == BOT
    for qid, fields in ALL_KINDS_PICKS.items():
        await bridge.alice.send(bridge.room_id, answer_content(questions[(qid, 1)], **fields))
    for qid in ALL_KINDS_PICKS:
        await bridge.wait_answer("kinds", qid)
    check_all_kinds_read(read_set(bridge.sets_root / "kinds"))


async def test_a_replayed_transaction_changes_nothing_and_tokens_are_checked(bridge):
    questions = await started(bridge)
    token = bridge.synapse.appservice["hs_token"]
    event = fake_answer(bridge, questions[("branch", 1)], option_id="main")
    body = {"events": [event]}
    url = endpoint(bridge, f"/_matrix/app/v1/transactions/replay-{unique('t')}")
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        async with http.put(url, json=body) as response:
            assert (response.status, await response.json()) == (200, {})
        # The 200 came after the answer was durable: no waiting needed.
        first = bridge.answers("kinds")
        assert first["answers"]["branch"]["source"]["event_id"] == event["event_id"]
        log_count = accepted_count(bridge)

        async with http.put(url, json=body) as response:
            assert response.status == 200
        again = f"/transactions/other-{unique('t')}"  # another transaction id, the legacy path, same event
        async with http.put(endpoint(bridge, again), json=body) as response:
            assert response.status == 200
        assert bridge.answers("kinds")["rev"] == first["rev"]
        assert bridge.answers("kinds")["answers"] == first["answers"]
        assert accepted_count(bridge) == log_count

        async with http.get(endpoint(bridge, "/health")) as response:
            health = await response.json()
            tasks = health.pop("tasks")
            assert 0 <= health.pop("homeserver_silent_seconds") < 31, health  # asked after 15 s without a push
            assert health == {"live": True, "ready": True,
                              "held": {"sets_held": 0, "events_set_aside": 0, "notices_dropped": 0,
                                       "events_waiting": 0, "sets_not_posted": 0, "webhooks_pending": 0}}
            assert tasks["transport"]["state"] == tasks["catch-up"]["state"] == tasks["homeserver-watch"]["state"] \
                == "running", tasks
        async with http.post(endpoint(bridge, "/_matrix/app/v1/ping"), json={}) as response:
            assert (response.status, await response.json()) == (200, {})

    later = fake_answer(bridge, questions[("branch", 1)], option_id="stable")
    async with aiohttp.ClientSession() as http:
        for headers, params in (({"Authorization": "Bearer wrong"}, {}), ({}, {}), ({}, {"access_token": "wrong"})):
            async with http.put(endpoint(bridge, f"/_matrix/app/v1/transactions/{unique('bad')}"),
                                json={"events": [later]}, headers=headers, params=params) as response:
                assert response.status == 403
                assert (await response.json())["errcode"] == "M_FORBIDDEN"
        assert bridge.answers("kinds")["rev"] == first["rev"]
        # The legacy query-parameter token is accepted.
        async with http.put(endpoint(bridge, f"/transactions/{unique('legacy')}"), json={"events": [later]},
                            params={"access_token": token}) as response:
            assert response.status == 200
    assert bridge.answers("kinds")["answers"]["branch"]["choice"] == "stable"


async def test_kill_9_while_the_homeserver_pushes_loses_and_repeats_nothing(bridge):
    questions = await started(bridge)
    alice, room = bridge.alice, bridge.room_id
    question = questions[("name", 1)]
    total = 60
    sent: list[str] = []

    async def answer_in_a_loop() -> None:
        for i in range(total):
            sent.append(await alice.send(room, answer_content(question, text=f"take {i}")))
            await asyncio.sleep(0.05)

    async def kill_twice() -> None:
        for after in (15, 35):
            while len(sent) < after:
                await asyncio.sleep(0.01)
            bridge.kill()
            await asyncio.sleep(0.5)
            bridge.start()

    began = time.monotonic()
    await asyncio.gather(answer_in_a_loop(), kill_twice())
    record = await bridge.wait_answer("kinds", "name", rev=total, timeout=60)
    settled = time.monotonic() - began

    assert record["rev"] == total
    assert (record["text"], record["source"]["event_id"]) == (f"take {total - 1}", sent[-1])
    assert accepted_count(bridge) == total
    assert store_rows(bridge.store_path, "SELECT event_id FROM answer_log GROUP BY event_id HAVING COUNT(*) > 1") == []
    logged = {row[0] for row in store_rows(bridge.store_path, "SELECT event_id FROM answer_log")}
    assert logged == set(sent)
    assert len(question_posts(await alice.messages(room))) == QUESTION_COUNT

    # Every answer is told, even those whose notice was cut off by a kill: by a
    # notice of its own, or within the one reply that answers several answers
    # of hers to the question not yet told (the one that stands, "This replaces
    # N earlier answers"); none is told twice.
    deadline = time.monotonic() + 30
    while True:
        told = store_rows(bridge.store_path, "SELECT COUNT(*) FROM answer_log WHERE acked IN (1, 2)")[0][0]
        events = await alice.messages(room, limit=1000)
        notices: dict[str, int] = {}
        for e in events:
            outcome = e.get("content", {}).get("dev.superpipeline.question.outcome")
            if outcome:
                notices[outcome["answer_event_id"]] = notices.get(outcome["answer_event_id"], 0) + 1
        if (told == total and sent[-1] in notices) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.3)
    assert told == total and sent[-1] in notices
    assert set(notices) <= set(sent) and set(notices.values()) == {1}
    replies = [e["content"]["body"] for e in events if e.get("content", {}).get(
        "dev.superpipeline.question.outcome", {}).get("answer_event_id") in sent]
    covered = sum(1 + int(m.group(1)) if (m := re.search(r"replaces (\d+) earlier answers?", body)) else 1
                  for body in replies)
    assert covered == total, f"{covered} answers told in {len(replies)} replies"
    print(f"60 answers, two kill -9s: all durable {settled:.1f} s after the first send")


async def test_a_start_whose_ping_lands_on_synapses_own_retry_still_ends_the_hold(bridge):
    """After a failed push Synapse holds the bridge's transactions and retries
    them with a back-off (2 s, 4 s, 8 s, up to minutes), dropping meanwhile
    the to-device messages (room keys) it would push with them.  A start
    ends that by asking the homeserver to ping the bridge: a ping that
    reaches it makes Synapse retry at once.  Synapse's ping fails (502,
    "AlreadyCalled") when it lands while its own retry is in flight: here a
    relay in front of the bridge holds that retry until the bridge's first
    ping has gone by.  The bridge asks again, and the held transaction comes
    within seconds, not after the next back-off."""
    registered = urlsplit(bridge.synapse.appservice["url"])
    port = free_port()
    bridge.extra_config["appservice"]["listen"] = f"127.0.0.1:{port}"
    seen: list[str] = []

    def noted(request: Any) -> bool:
        seen.append("ping" if request.path.endswith("/ping") else "push" if "/transactions/" in request.path else "")
        return False

    async with Relay((registered.hostname, registered.port), f"http://127.0.0.1:{port}") as relay:
        questions = await started(bridge)
        bridge.kill()
        relay.fail = noted
        away = await bridge.alice.send(bridge.room_id, answer_content(questions[("approve", 1)], option_id="approve"))
        await until(lambda: seen.count("push") >= 2, timeout=30)  # the push and Synapse's first retry: nobody there
        relay.hold = hold = asyncio.Event()
        await until(lambda: relay.held == 1, timeout=30)  # its second retry, in flight
        bridge.start()
        await until(lambda: "ping" in seen, timeout=60)
        await asyncio.sleep(0.3)  # Synapse answers the bridge's ping 502 meanwhile
        relay.hold = None
        hold.set()  # the retry fails: Synapse's next one is 8 s away
        released = time.monotonic()
        await until(lambda: away in relay.delivered, timeout=30)
        waited = time.monotonic() - released
        assert waited < 4, f"the held transaction came {waited:.1f} s after Synapse's retry failed"
        assert seen.count("ping") >= 2
        assert "the homeserver reaches the bridge" in bridge.log_text()
        record = await bridge.wait_answer("kinds", "approve", timeout=30)
        assert record["source"]["event_id"] == away


async def test_answers_whose_transaction_never_reaches_the_bridge_still_land(bridge):
    """The homeserver counts a transaction as delivered that the bridge never
    got (Synapse strands one now and then when it recovers from the bridge
    being away; here a relay in front of the bridge answers it instead): the
    bridge finds the answer in the room's timeline: while it runs, before it
    handles the next transaction (whose id skips one), so the order of the
    answers holds; and on start, after one was lost while it was down."""
    registered = urlsplit(bridge.synapse.appservice["url"])
    port = free_port()
    bridge.extra_config["appservice"]["listen"] = f"127.0.0.1:{port}"
    async with Relay((registered.hostname, registered.port), f"http://127.0.0.1:{port}") as relay:
        questions = await started(bridge)
        alice, room = bridge.alice, bridge.room_id

        relay.swallow = lambda event: event.get("content", {}).get("body") == "lost while running"
        lost = await alice.send(room, answer_content(questions[("name", 1)], text="lost while running"))
        await until(lambda: lost in relay.swallowed)
        relay.swallow = lambda event: False
        # The next transaction's id skips one: what went missing is judged first, so the later answer wins.
        later = await alice.send(room, answer_content(questions[("name", 1)], text="sent after it"))
        record = await bridge.wait_answer("kinds", "name", rev=2, timeout=15)
        assert (record["text"], record["source"]["event_id"]) == ("sent after it", later)
        logged = [row[0] for row in store_rows(bridge.store_path, "SELECT event_id FROM answer_log ORDER BY seq")]
        assert logged == [lost, later]

        bridge.kill()
        relay.answer_all = True  # acknowledged by someone else: the homeserver holds nothing for the bridge
        away = await alice.send(room, answer_content(questions[("approve", 1)], option_id="approve"))
        await until(lambda: away in relay.swallowed)
        relay.answer_all = False
        bridge.start()
        record = await bridge.wait_answer("kinds", "approve", timeout=30)
        assert record["source"]["event_id"] == away
        assert relay.passed > 0

    assert accepted_count(bridge) == 3
    assert store_rows(bridge.store_path, "SELECT event_id FROM answer_log GROUP BY event_id HAVING COUNT(*) > 1") == []
    assert bridge.log_text().count("came in no transaction") >= 2


async def test_health_says_when_the_homeserver_cannot_reach_the_bridge_until_it_can(bridge):
    """The registration's URL reaches nothing (a proxy down, a wrong port):
    answers still come, from the rooms' timelines every 30 s, but no push
    does.  /health said ready and nothing else; it names the failure until
    the homeserver gets through."""
    import json as json_lib
    import urllib.error
    import urllib.request

    registered = urlsplit(bridge.synapse.appservice["url"])
    port = free_port()
    bridge.extra_config["appservice"]["listen"] = f"127.0.0.1:{port}"

    def health() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                return json_lib.loads(reply.read())
        except urllib.error.HTTPError as error:
            return json_lib.loads(error.read())
        except (urllib.error.URLError, OSError):
            return {}

    await started(bridge)
    await until(lambda: "homeserver_cannot_reach_bridge" in health(), timeout=60, every=0.5)
    said = health()
    assert "Connection refused" in said["homeserver_cannot_reach_bridge"]["error"], said
    async with Relay((registered.hostname, registered.port), f"http://127.0.0.1:{port}"):
        await until(lambda: "homeserver_cannot_reach_bridge" not in health(), timeout=60, every=0.5)
    bridge.check_alive()


async def test_a_restart_into_quiet_rooms_is_ready_without_a_push(bridge):
    """Only a pushed transaction made the bridge ready: restarted into rooms
    where nobody says anything, /health stayed 503 "ready": false for good,
    and a readiness check gating the homeserver's pushes never let it in."""
    import json as json_lib
    import urllib.error
    import urllib.request

    def ready() -> bool:
        try:
            with urllib.request.urlopen(endpoint(bridge, "/health"), timeout=5) as reply:
                return bool(json_lib.loads(reply.read()).get("ready"))
        except (urllib.error.URLError, OSError, ValueError):
            return False

    await started(bridge)
    await until(ready, timeout=60, every=0.5)
    assert bridge.stop() == 0
    bridge.start()
    await until(ready, timeout=30, every=0.5)
    bridge.check_alive()


async def test_a_homeserver_gone_while_the_bridge_runs_shows_in_health_and_answers_come_after(bridge, synapse):
    """Nothing long-polls in appservice mode: a homeserver that went away
    while the bridge ran left /health as it was, ready and quiet, for as
    long.  Its silence is counted now, as in bot mode, and ends with it."""
    questions = await started(bridge)

    async def silence_where(holds: Any) -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as http, http.get(endpoint(bridge, "/health")) as response:
            seen = await response.json()
        return seen if holds(seen["homeserver_silent_seconds"]) else None

    assert await silence_where(lambda seconds: seconds < 31)
    synapse.stop()
    try:
        seen = await until(lambda: silence_where(lambda seconds: seconds >= 25), timeout=60, every=1,
                           what="the homeserver's silence counted")
        assert seen["ready"] is True and seen["live"] is True  # answers wait; nothing of the bridge failed
    finally:
        synapse.start()
    await until(lambda: silence_where(lambda seconds: seconds < 15), timeout=40, every=1,
                what="the homeserver heard again")
    await bridge.alice.send(bridge.room_id, answer_content(questions[("name", 1)], text="after the outage"))
    assert (await bridge.wait_answer("kinds", "name", timeout=60))["text"] == "after the outage"


async def test_an_admins_direct_message_still_takes_commands_after_a_restart(bridge, synapse):
    """The homeserver pushes a room's events to the bridge, which takes those
    of the rooms it bridges: a direct message an admin brought it into was
    bridged until the next start, then its commands went unanswered for good
    (the bridge still in it, so no invite could bring it back)."""
    alice = bridge.alice
    bridge.extra_config = {**bridge.extra_config, "admins": [alice.user_id]}
    await started(bridge)
    direct = synapse.create_room(alice.token, invite=[BOT], is_direct=True)
    await until(lambda: f"joined {direct} at the invite of {alice.user_id}" in bridge.log_text(), what="join")

    async def answered(command: str) -> bool:
        for event in await alice.messages(direct):
            relates = event.get("content", {}).get("m.relates_to", {})
            if relates.get("m.in_reply_to", {}).get("event_id") == command and event["sender"] == BOT:
                return True
        return False

    first = await alice.send(direct, {"msgtype": "m.text", "body": "!ask status"})
    await until(lambda: answered(first), what="the reply before the restart", timeout=30)
    bridge.stop()
    bridge.start()
    again = await alice.send(direct, {"msgtype": "m.text", "body": "!ask status"})
    await until(lambda: answered(again), what="the reply after the restart", timeout=30)
