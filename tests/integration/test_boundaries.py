"""Who may answer, where, and what the bridge lets out: people who left,
answers aimed at another room's question, invites from strangers, markup in
answers shown back, and secrets in logs."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest
import yaml

from bridge.devserver import _http_json
from helpers.attack import AS_BOT, text_set
from helpers.harness import Bridge, Person, answer_content, store_rows, unique
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration


def leave(synapse, token: str, room_id: str) -> None:
    quoted = urllib.request.quote(room_id, safe="")
    _http_json("POST", f"{synapse.url}/_matrix/client/v3/rooms/{quoted}/leave", {}, token)


async def declined(synapse, bot: str, invites: list[tuple[str, str]], timeout: float) -> None:
    """Waits until ``bot`` has left every (inviter's token, room) it was invited to."""
    deadline = time.monotonic() + timeout
    while True:
        states = tuple(membership(synapse, token, room, bot) for token, room in invites)
        if states == ("leave",) * len(invites) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert states == ("leave",) * len(invites), states


def membership(synapse, token: str, room_id: str, user_id: str) -> str | None:
    quoted, who = urllib.request.quote(room_id, safe=""), urllib.request.quote(user_id, safe="")
    try:
        return _http_json("GET", f"{synapse.url}/_matrix/client/v3/rooms/{quoted}/state/m.room.member/{who}",
                          None, token).get("membership")
    except RuntimeError:
        return None


def outcome_of(bridge: Bridge, event_id: str) -> tuple[str, str | None] | None:
    rows = store_rows(bridge.store_path, "SELECT outcome, reason FROM answer_log WHERE event_id=?", event_id)
    return rows[0] if rows else None


async def wait_outcome(bridge: Bridge, event_id: str, timeout: float = 30) -> tuple[str, str | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = outcome_of(bridge, event_id)
        if found:
            return found
        bridge.check_alive()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{event_id} was never judged\n{bridge.log_text()[-2000:]}")


async def test_an_answer_sent_before_its_sender_left_counts_though_the_bridge_reads_it_after(bridge, person, synapse):
    """With no answerers configured, the room's members may answer, as the
    timeline has them at each answer: someone who answered and then left
    while the bridge was down was a member when they answered (the bridge
    running would have taken it).  Someone never in the room, or an event
    the homeserver does not have, is refused (the appservice test below)."""
    bob = person()
    synapse.invite(bridge.bot["access_token"], bridge.room_id, bob.user_id)
    synapse.join(bob.token, bridge.room_id)
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    assert bridge.stop() == 0
    gone = await bob.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    leave(synapse, bob.token, bridge.room_id)
    stays = await bridge.alice.send(bridge.room_id, answer_content(questions[("name", 1)], text="Still here"))
    bridge.start()
    assert await wait_outcome(bridge, gone) == ("accepted", None)
    assert await wait_outcome(bridge, stays) == ("accepted", None)
    # (Waited for: the outcome is in the store a moment before answers.json is written.)
    assert (await bridge.wait_answer("kinds", "branch"))["source"]["sender"] == bob.user_id


async def test_an_answer_aimed_at_another_rooms_question_is_refused(bridge, synapse):
    alice = bridge.alice
    other_room = synapse.create_room(bridge.bot["access_token"], invite=[alice.user_id])
    synapse.join(alice.token, other_room)
    bridge.extra_config = {"rooms": {"default": bridge.room_id, "sets": {"other": other_room}}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.add_set(text_set("other", 1))
    bridge.start()
    await bridge.wait_questions(alice, 8)
    deadline = time.monotonic() + 30
    while not (found := await alice.questions(other_room)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    elsewhere = found[("q0", 1)]
    # The homeserver itself refuses an m.reference across rooms; a reply is
    # not checked there, so this one reaches the bridge, which must refuse it.
    event_id = await alice.send(bridge.room_id, {"msgtype": "m.text", "body": "Sent to the wrong room",
                                                 "m.relates_to": {"m.in_reply_to": {"event_id": elsewhere["event_id"]}}})
    assert await wait_outcome(bridge, event_id) == ("refused", "wrong_room")
    notice = await alice.wait_notice(bridge.room_id, event_id)
    assert notice["content"]["dev.superpipeline.question.outcome"]["reason"] == "wrong_room"
    assert bridge.answers("other")["answers"] == {}


async def test_invites_to_other_rooms_are_declined(bridge, person, synapse):
    """The bridge joins only its configured rooms: an invite from someone who
    is not an answerer, or to a room it is not configured for, is rejected."""
    mallory = person()
    alice = bridge.alice
    bridge.extra_config = {"answerers": [alice.user_id]}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    await bridge.wait_questions(alice, 8)
    bot = bridge.bot["user_id"]
    strangers_room = synapse.create_room(mallory.token, invite=[bot])
    answerers_room = synapse.create_room(alice.token, invite=[bot])
    await declined(synapse, bot, [(mallory.token, strangers_room), (alice.token, answerers_room)], timeout=20)
    # The homeserver shows the leave a moment before the bridge's line about it is written.
    deadline = time.monotonic() + 10
    while bridge.log_text().count("declined an invite") < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert bridge.log_text().count("declined an invite") == 2
    # Still at work in its own room.
    event_id = await alice.send(bridge.room_id, answer_content(
        (await bridge.wait_questions(alice, 8))[("name", 1)], text="Still answered"))
    assert await wait_outcome(bridge, event_id) == ("accepted", None)


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)> **bold** [link](https://evil.example) &amp;'


async def test_markup_in_answers_is_escaped_in_the_notices(bridge):
    """The notices quote what people wrote: it must arrive as text, never as
    markup, in every client."""
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    alice, room = bridge.alice, bridge.room_id
    recorded = await alice.send(room, answer_content(questions[("name", 1)], text=HOSTILE[:70]))
    refused = await alice.send(room, answer_content(questions[("branch", 1)], option_id=HOSTILE))
    for event_id in (recorded, refused):
        content = (await alice.wait_notice(room, event_id))["content"]
        html = content["formatted_body"]
        assert "<script" not in html and "<img" not in html and "<b>" not in html and "<a " not in html
        assert "&lt;script&gt;" in html or "&lt;img" in html
        assert content["format"] == "org.matrix.custom.html"
    assert bridge.answers("kinds")["answers"]["name"]["text"] == HOSTILE[:70]


def _scan(text: str, secret_values: list[str]) -> list[str]:
    return [value[:6] + "…" for value in secret_values if value and value in text]


async def test_no_secret_in_the_logs_of_a_password_login_or_a_refused_token(bridge, synapse, tmp_path):
    """Logged in with a password at DEBUG: neither the password nor the token
    the homeserver issued shows up.  A refused token is not echoed back, and
    a config readable by others gets a warning."""
    password_bot = synapse.register(f"pw{secrets.token_hex(4)}")
    synapse.invite(bridge.bot["access_token"], bridge.room_id, password_bot["user_id"])
    bridge.bot = {"user_id": password_bot["user_id"], "access_token": None}
    bridge.extra_config = {"bot": {"password": password_bot["password"], "access_token": None}}
    bridge.add_set(text_set("pw", 1))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 1, timeout=60)
    event_id = await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="word"))
    await bridge.alice.wait_notice(bridge.room_id, event_id)
    assert bridge.stop() == 0
    issued = store_rows(bridge.store_path, "SELECT value FROM meta WHERE key='access_token'")[0][0]
    log = bridge.log_text()
    assert "DEBUG" in log
    assert _scan(log, [password_bot["password"], issued, password_bot["access_token"]]) == []

    wrong = f"wrong-{secrets.token_hex(20)}"
    config = tmp_path / "readable.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": synapse.url}, "bot": {"user_id": password_bot["user_id"], "access_token": wrong},
        "sets": {"root": str(tmp_path / "sets")}, "rooms": {"default": bridge.room_id},
        "store": {"path": str(tmp_path / "other.sqlite")}, "logging": {"level": "DEBUG"}}))
    os.chmod(config, 0o644)
    result = subprocess.run([sys.executable, "-m", "bridge", "run", "-c", str(config)], capture_output=True,
                            text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "readable by other users" in output
    assert "access token was refused" in output
    assert _scan(output, [wrong]) == []


async def test_appservice_refuses_forged_answers_and_wrong_tokens(appservice_synapse, tmp_path):
    """A homeserver that pushed what Synapse would never accept (or one that
    forged events) still meets the bridge's own checks: an answer to another
    room's question, an answer from someone who left, one from a stranger are
    refused; a wrong hs_token is turned away before anything is read."""
    hs = appservice_synapse
    alice, bob, carol = (Person(hs, hs.register(unique(name))) for name in ("alice", "bob", "carol"))
    bridge: Bridge | None = None
    try:
        room = hs.create_room(alice.token, invite=[AS_BOT, bob.user_id])
        other_room = hs.create_room(alice.token, invite=[AS_BOT])
        bridge = Bridge(synapse=hs, workdir=tmp_path, room_id=room, bot={"user_id": AS_BOT, "access_token": None},
                        extra_config={"appservice": dict(hs.appservice),
                                      "rooms": {"default": room, "sets": {"other": other_room}}})
        bridge.sets_root.mkdir()
        bridge.add_set(all_kinds_set("kinds"))
        bridge.add_set(text_set("other", 1))
        hs.join(bob.token, room)
        bridge.start()
        questions = await bridge.wait_questions(alice, 8)
        deadline = time.monotonic() + 30
        while not (found := await alice.questions(other_room)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        elsewhere = found[("q0", 1)]
        # Real events of Bob's, whose ids a forger may reuse once he has left.
        said = await bob.send(room, {"msgtype": "m.text", "body": "hello all"})
        joined_id = next(e["event_id"] for e in await alice.messages(room)
                         if e["type"] == "m.room.member" and e.get("state_key") == bob.user_id
                         and e["content"].get("membership") == "join")
        leave(hs, bob.token, room)
        # The bridge hears of the leave through the homeserver's push, in
        # order: once an answer sent after it is judged, the leave is known.
        sentinel = await alice.send(room, answer_content(questions[("branch", 1)], option_id="main"))
        assert await wait_outcome(bridge, sentinel) == ("accepted", None)

        def pushed(sender: str, content: dict) -> dict:
            return {"type": "m.room.message", "event_id": f"$forged{secrets.token_hex(8)}", "room_id": room,
                    "sender": sender, "origin_server_ts": int(time.time() * 1000), "content": content}

        cases = {
            "wrong_room": pushed(alice.user_id, answer_content(elsewhere, text="aimed elsewhere")),
            "left": pushed(bob.user_id, answer_content(questions[("name", 1)], text="from the door")),
            # (the homeserver has these ids, from Bob, but not these events)
            "left, his join's id": {**pushed(bob.user_id, answer_content(questions[("name", 1)], text="joined")),
                                    "event_id": joined_id},
            "left, his message's id": {**pushed(bob.user_id, answer_content(questions[("name", 1)], text="said")),
                                       "event_id": said},
            "stranger": pushed(carol.user_id, answer_content(questions[("name", 1)], text="from outside")),
            "fine": pushed(alice.user_id, answer_content(questions[("name", 1)], text="from alice")),
        }
        url = hs.appservice["url"] + f"/_matrix/app/v1/transactions/forged-{secrets.token_hex(4)}"
        body = {"events": list(cases.values())}
        async with aiohttp.ClientSession() as http:
            for token in ("wrong", hs.appservice["as_token"], ""):
                async with http.put(url, json=body, headers={"Authorization": f"Bearer {token}"}) as response:
                    assert response.status == 403
            assert all(outcome_of(bridge, event["event_id"]) is None for event in cases.values())
            async with http.put(url, json=body,
                                headers={"Authorization": f"Bearer {hs.appservice['hs_token']}"}) as response:
                assert response.status == 200
        outcomes = {name: outcome_of(bridge, event["event_id"]) for name, event in cases.items()}
        assert outcomes == {"wrong_room": ("refused", "wrong_room"), "left": ("refused", "sender_not_allowed"),
                            "left, his join's id": ("refused", "sender_not_allowed"),
                            "left, his message's id": ("refused", "sender_not_allowed"),
                            "stranger": ("refused", "sender_not_allowed"), "fine": ("accepted", None)}
        assert bridge.answers("kinds")["answers"]["name"]["text"] == "from alice"
        assert bridge.answers("other")["answers"] == {}
        bridge.kill()
    finally:
        if bridge is not None:
            bridge.kill()
        for p in (alice, bob, carol):
            await p.close()



async def test_appservice_declines_invites_from_strangers_and_to_other_rooms(appservice_synapse, tmp_path):
    """Pushed invites are answered like synced ones: only a configured room, at
    the invite of an answerer, is joined; every other invite is rejected."""
    hs = appservice_synapse
    alice, mallory = (Person(hs, hs.register(unique(name))) for name in ("alice", "mallory"))
    bridge: Bridge | None = None
    try:
        room = hs.create_room(alice.token, invite=[AS_BOT])
        bridge = Bridge(synapse=hs, workdir=tmp_path, room_id=room, bot={"user_id": AS_BOT, "access_token": None},
                        extra_config={"appservice": dict(hs.appservice), "answerers": [alice.user_id]})
        bridge.sets_root.mkdir()
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        await bridge.wait_questions(alice, 8)
        strangers_room = hs.create_room(mallory.token, invite=[AS_BOT])
        unconfigured_room = hs.create_room(alice.token, invite=[AS_BOT])
        await declined(hs, AS_BOT, [(mallory.token, strangers_room), (alice.token, unconfigured_room)], timeout=30)
        assert bridge.log_text().count("declined an invite") == 2
        bridge.check_alive()
    finally:
        if bridge is not None:
            bridge.kill()
        for p in (alice, mallory):
            await p.close()
