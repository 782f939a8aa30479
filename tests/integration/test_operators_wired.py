"""Operators against a real Synapse, through the running bridge: /metrics and
/health move during a run; management commands work for an admin and are
refused for others; reminders nudge unanswered questions once per period."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from functools import partial

import pytest

from bridge.devserver import free_port
from helpers.harness import answer_content
from helpers.sets import all_kinds_set
from helpers.waiting import until

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8

NOTHING_HELD = {"sets_held": 0, "events_set_aside": 0, "notices_dropped": 0, "events_waiting": 0,
                "sets_not_posted": 0, "webhooks_pending": 0}



def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


until = partial(until, every=0.2)


async def test_metrics_and_health_move_during_a_run(bridge):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    bridge.extra_config = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)

    async def ready():
        status, body = await asyncio.to_thread(get, base + "/health")
        seen = json.loads(body)
        tasks = seen.pop("tasks", {})  # the supervisor's tasks, each running (joining: done at once)
        silent = seen.pop("homeserver_silent_seconds", None)  # bot mode: a long poll comes back within 30 s
        return status == 200 and seen == {"live": True, "ready": True, "held": NOTHING_HELD} and \
            silent is not None and 0 <= silent < 31 and \
            {name: task["state"] for name, task in tasks.items()} == {
                "transport": "running", "notices": "running", "sets": "running", "joining": "finished",
                "commands": "running", "deadlines": "running", "strays": "running", "checkpoints": "running",
                "held-back": "running", "downloads": "running"}
    await until(ready, what="ready /health")

    # Ready means answers are taken; the first posting may still be finishing
    # its last question (its poll, its thread) beside them.
    async def all_posted():
        _status, text = await asyncio.to_thread(get, base + "/metrics")
        return text if metric(text, "askwright_bridge_questions_posted_total") == QUESTION_COUNT else None
    text = await until(all_posted, what=f"{QUESTION_COUNT} questions counted as posted")
    assert metric(text, "askwright_bridge_questions_posted_total") == QUESTION_COUNT
    assert metric(text, "askwright_bridge_ready") == 1
    events_before = metric(text, "askwright_bridge_events_processed_total")

    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    refused = await bridge.alice.send(bridge.room_id, answer_content(questions[("takes", 1)], option_id="nope"))
    await bridge.wait_answer("kinds", "branch")
    await bridge.alice.wait_notice(bridge.room_id, refused)

    _status, text = await asyncio.to_thread(get, base + "/metrics")
    assert metric(text, "askwright_bridge_answers_accepted_total") == 1
    assert 'askwright_bridge_answers_refused_total{layer="recorded",reason="option_not_offered"} 1.0' in text
    assert metric(text, "askwright_bridge_events_processed_total") > events_before
    assert metric(text, "askwright_bridge_answers_write_seconds_count") >= 1
    assert 0 <= metric(text, "askwright_bridge_sync_lag_seconds") < 60
    assert bridge.stop() == 0


async def test_management_commands_work_for_an_admin_and_are_refused_for_others(bridge, person, synapse):
    bob = person()
    bridge.extra_config = {"admins": [bridge.alice.user_id], "answerers": [bridge.alice.user_id]}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    synapse.invite(bridge.bot["access_token"], bridge.room_id, bob.user_id)
    synapse.join(bob.token, bridge.room_id)
    alice, room = bridge.alice, bridge.room_id

    async def reply_to(event_id: str, where: str = room) -> dict | None:
        for event in await alice.messages(where):
            relates = event.get("content", {}).get("m.relates_to", {})
            if relates.get("m.in_reply_to", {}).get("event_id") == event_id and event["sender"] == bridge.bot["user_id"]:
                return event
        return None

    status = await alice.send(room, {"msgtype": "m.text", "body": "!ask status"})
    reply = await until(lambda: reply_to(status), what="status reply")
    assert "kinds" in reply["content"]["body"] and "PENDING" in reply["content"]["body"]

    # In a direct message, as the guide offers admins: the bridge takes her invite.
    direct = synapse.create_room(alice.token, invite=[bridge.bot["user_id"]], is_direct=True)
    await until(lambda: f"joined {direct} at the invite of {alice.user_id}" in bridge.log_text(), what="join")
    status = await alice.send(direct, {"msgtype": "m.text", "body": "!ask status"})
    reply = await until(lambda: reply_to(status, direct), what="status reply in the direct message")
    assert "kinds" in reply["content"]["body"]
    # Anyone else's invite into a room of theirs is declined.
    bobs = synapse.create_room(bob.token, invite=[bridge.bot["user_id"]], is_direct=True)
    await until(lambda: f"declined an invite to {bobs} from {bob.user_id}" in bridge.log_text(), what="decline")

    refused = await bob.send(room, {"msgtype": "m.text", "body": "!ask close kinds branch"})
    reply = await until(lambda: reply_to(refused), what="refusal")
    assert "only the bridge's admins" in reply["content"]["body"]
    questions_file = bridge.sets_root / "kinds" / "questions.json"
    assert all(q.get("status", "open") == "open" for q in json.loads(questions_file.read_text())["questions"])

    close = await alice.send(room, {"msgtype": "m.text", "body": "!ask close kinds branch"})
    reply = await until(lambda: reply_to(close), what="close reply")
    assert "Closed “branch”" in reply["content"]["body"]
    branch = next(q for q in json.loads(questions_file.read_text())["questions"] if q["id"] == "branch")
    assert branch["status"] == "closed"

    async def closed_notice():
        return [e for e in await alice.messages(room)
                if e.get("content", {}).get("dev.superpipeline.question.closed", {}).get("qid") == "branch"]
    await until(closed_notice, what="closing notice")
    # The commands were never taken for answers.
    assert bridge.answers("kinds")["answers"] == {}
    bridge.check_alive()


async def test_a_metrics_port_already_taken_stops_the_bridge_with_the_reason(bridge):
    # The operators start after the first batch (start-up); failing to, the
    # bridge still stops and says why instead of running without them.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bridge.extra_config = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        code = await asyncio.to_thread(bridge.process.wait, 30)
    assert code != 0
    assert "address already in use" in bridge.log_text().lower()


async def test_a_command_sent_while_the_bridge_was_stopped_is_answered_when_it_starts(bridge):
    # The first sync's batch is handled before the operators' services start
    # (start-up): a command in it waits for them instead of being lost.
    bridge.extra_config = {"admins": [bridge.alice.user_id]}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    bridge.stop()
    alice, room = bridge.alice, bridge.room_id
    status = await alice.send(room, {"msgtype": "m.text", "body": "!ask status"})
    bridge.start()

    async def reply() -> dict | None:
        return next((e for e in await alice.messages(room) if e["sender"] == bridge.bot["user_id"] and
                     e.get("content", {}).get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id") == status),
                    None)

    answered = await until(reply, what="status reply after the restart")
    assert "kinds" in answered["content"]["body"]
    bridge.check_alive()


async def test_reminders_nudge_unanswered_questions_once_per_period(bridge):
    bridge.extra_config = {"reminders": {"enabled": True, "after": "2s", "every": "1h"}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.wait_answer("kinds", "branch")

    async def reminders():
        found = [e for e in await bridge.alice.messages(bridge.room_id)
                 if "dev.superpipeline.question.reminder" in e.get("content", {})]
        return found if len(found) >= QUESTION_COUNT - 1 else None
    found = await until(reminders, timeout=30, what="reminders")
    nudged = [e["content"]["dev.superpipeline.question.reminder"]["qid"] for e in found]
    assert sorted(nudged) == sorted(qid for qid, _rev in questions if qid != "branch")
    for event in found:
        assert event["content"]["m.relates_to"]["rel_type"] == "m.thread"
    await asyncio.sleep(4)  # several passes later: still once per question
    again = [e for e in await bridge.alice.messages(bridge.room_id)
             if "dev.superpipeline.question.reminder" in e.get("content", {})]
    assert len(again) == QUESTION_COUNT - 1
