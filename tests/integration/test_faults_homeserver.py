"""The homeserver misbehaves: it goes away for half a minute, it answers
429 with Retry-After (its real rate limiter, turned down), it answers slowly.
The bridge waits, retries and loses nothing."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from bridge.devserver import Synapse
from helpers.agents import free_port
from helpers.attack import room_history, text_set
from helpers.harness import Bridge, Person, answer_content, question_posts, read_set, unique
from helpers.sets import ALL_KINDS_PICKS, all_kinds_set, check_all_kinds_read

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 30


def _health_and_metrics(port: int) -> tuple[dict, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        health = json.loads(response.read())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return health, response.read().decode()


def _sample(text: str, name: str) -> float:
    """The sum of a metric's samples in the exposition (0 when it has none)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def test_homeserver_down_30_seconds_then_back_loses_nothing(bridge, synapse):
    port = free_port()
    bridge.extra_config = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 8)
    alice, room = bridge.alice, bridge.room_id
    # Sent, and the homeserver stopped at once: the bridge may or may not have
    # seen it before the homeserver went away.
    before = await alice.send(room, answer_content(questions[("branch", 1)], option_id="stable"))
    synapse.stop()
    went = time.monotonic()
    while time.monotonic() - went < OUTAGE_SECONDS:
        bridge.check_alive()  # it waits; it does not give up and exit
        await asyncio.sleep(1)
    # What monitoring sees: nio retries without end (nothing of the bridge's
    # own fails), so the silence itself, and nio's warnings, must show.
    health, metrics = _health_and_metrics(port)
    assert health["homeserver_silent_seconds"] >= OUTAGE_SECONDS - 5, health
    assert _sample(metrics, "askwright_bridge_homeserver_silent_seconds") >= OUTAGE_SECONDS - 5
    assert _sample(metrics, 'askwright_bridge_errors_total{where="nio"}') \
        + _sample(metrics, 'askwright_bridge_errors_total{where="bot"}') >= 1, metrics
    synapse.start()
    after = await alice.send(room, answer_content(questions[("name", 1)], text="After the outage"))

    branch = await bridge.wait_answer("kinds", "branch", timeout=60)
    name = await bridge.wait_answer("kinds", "name", timeout=60)
    assert (branch["source"]["event_id"], branch["choice"], branch["rev"]) == (before, "stable", 1)
    assert (name["source"]["event_id"], name["text"], name["rev"]) == (after, "After the outage", 1)
    for event_id in (before, after):
        notice = await alice.wait_notice(room, event_id, timeout=30)
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert len(question_posts(await room_history(alice, room))) == 8
    log = bridge.log_text()
    # It did meet the outage, and retried (inside the client, or the whole batch).
    assert "Timed out, sleeping" in log or "sync batch not handled" in log
    assert _health_and_metrics(port)[0]["homeserver_silent_seconds"] < 31  # a long poll comes back within 30 s
    bridge.check_alive()


def _send_raw(synapse: Synapse, token: str, room_id: str, n: int) -> tuple[int, dict[str, str]]:
    quoted = urllib.request.quote(room_id, safe="")
    request = urllib.request.Request(f"{synapse.url}/_matrix/client/v3/rooms/{quoted}/send/m.room.message/raw{n}",
                                     data=json.dumps({"msgtype": "m.text", "body": f"raw {n}"}).encode(),
                                     method="PUT", headers={"Authorization": f"Bearer {token}",
                                                            "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


async def test_rate_limited_homeserver_answers_429_and_the_bridge_waits_it_out(tmp_path):
    # Synapse's own message limiter, turned down: two messages at once, then one every two seconds.
    limited = Synapse(tmp_path / "synapse", extra_config={"rc_message": {"per_second": 0.5, "burst_count": 2}})
    limited.start()
    people: list[Person] = []
    bridge: Bridge | None = None
    try:
        bot = limited.register(unique("askbot"))
        alice = Person(limited, limited.register(unique("alice")))
        people.append(alice)
        room = limited.create_room(bot["access_token"], invite=[alice.user_id])
        limited.join(alice.token, room)

        # The limiter is real and says when to come back.
        probe = limited.register(unique("probe"))
        own_room = limited.create_room(probe["access_token"])
        replies = [_send_raw(limited, probe["access_token"], own_room, n) for n in range(4)]
        assert 429 in [status for status, _headers in replies], replies
        assert all(int(headers["Retry-After"]) >= 1 for status, headers in replies if status == 429)

        bridge = Bridge(synapse=limited, workdir=tmp_path / "bridge", room_id=room, bot=bot)
        bridge.sets_root.mkdir(parents=True)
        bridge.add_set(text_set("limited", 3))
        bridge.start()
        questions = await bridge.wait_questions(alice, 3, timeout=60)
        sent = []
        for n in range(3):
            sent.append(await alice.send(room, answer_content(questions[(f"q{n}", 1)], text=f"word {n}")))
        for n in range(3):
            record = await bridge.wait_answer("limited", f"q{n}", timeout=60)
            assert (record["text"], record["source"]["event_id"]) == (f"word {n}", sent[n])
        for event_id in sent:
            await alice.wait_notice(room, event_id, timeout=60)
        assert len(question_posts(await room_history(alice, room))) == 3
        assert "Got 429 response" in bridge.log_text()  # the bridge really was turned away, and waited
        bridge.check_alive()
    finally:
        if bridge is not None:
            bridge.kill()
        for p in people:
            await p.close()
        limited.stop()


class SlowProxy:
    """A TCP proxy that holds every chunk the homeserver sends back for
    ``delay`` seconds: each response arrives at least that late."""

    def __init__(self, target_port: int, delay: float):
        self.target_port = target_port
        self.delay = delay
        self.server: asyncio.Server | None = None
        self.port = 0
        self.chunks_delayed = 0

    async def __aenter__(self) -> "SlowProxy":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, upstream_writer, 0),
                             self._pipe(upstream_reader, client_writer, self.delay), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                    self.chunks_delayed += 1
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


async def test_slow_homeserver_responses_lose_nothing(bridge, synapse):
    async with SlowProxy(synapse.port, delay=0.3) as proxy:
        bridge.extra_config["homeserver"] = {"url": f"http://127.0.0.1:{proxy.port}"}
        bridge.add_set(all_kinds_set("kinds"))
        bridge.start()
        questions = await bridge.wait_questions(bridge.alice, 8, timeout=60)
        sent = {}
        for qid, fields in ALL_KINDS_PICKS.items():
            sent[qid] = await bridge.alice.send(bridge.room_id, answer_content(questions[(qid, 1)], **fields))
        for qid in ALL_KINDS_PICKS:
            record = await bridge.wait_answer("kinds", qid, timeout=60)
            assert record["source"]["event_id"] == sent[qid]
        for event_id in sent.values():
            await bridge.alice.wait_notice(bridge.room_id, event_id, timeout=60)
        check_all_kinds_read(read_set(bridge.sets_root / "kinds"))
        assert len(question_posts(await room_history(bridge.alice, bridge.room_id))) == 8
        assert proxy.chunks_delayed > 20  # the bridge really talked through the slow path
        bridge.check_alive()
        bridge.kill()


def _health(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _health_while_down(bridge: Bridge, port: int, timeout: float,
                             served: Any = lambda _health: True) -> tuple[int, dict]:
    """/health once the bridge answers it (and ``served`` holds of it), its homeserver down."""
    deadline = time.monotonic() + timeout
    while True:
        bridge.check_alive()
        try:
            status, health = _health(port)
            if served(health):
                return status, health
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.monotonic() < deadline, "no /health (as awaited) while the homeserver is down"
        await asyncio.sleep(0.5)


async def test_a_bridge_started_while_the_homeserver_is_down_answers_health_not_ready(bridge, synapse):
    # An orchestrator starts the bridge beside its homeserver, or restarts it
    # during the homeserver's outage: its probe must find the bridge alive
    # and not ready, not a refused connection (which reads as dead).
    port = free_port()
    bridge.extra_config = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    bridge.add_set(text_set("down", 1))
    synapse.stop()
    bridge.start()
    status, health = await _health_while_down(bridge, port, 30,
                                              lambda health: health.get("homeserver_silent_seconds", 0) >= 5)
    assert (status, health["live"], health["ready"]) == (503, True, False), health
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert _sample(metrics, "askwright_bridge_ready") == 0
    assert _sample(metrics, 'askwright_bridge_errors_total{where="nio"}') >= 1, metrics

    synapse.start()
    questions = await bridge.wait_questions(bridge.alice, 1, timeout=60)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="after the start"))
    assert (await bridge.wait_answer("down", "q0", timeout=60))["text"] == "after the start"
    status, health = _health(port)
    assert (status, health["ready"]) == (200, True), health
    assert health["homeserver_silent_seconds"] < 31


async def test_batches_the_store_refuses_show_in_health_until_they_are_made_durable(bridge):
    # An operator's session holds the store's write lock: no batch is made
    # durable (each is retried).  /health said ready, nothing held, every task
    # running; monitoring must see answers waiting, and why.
    import sqlite3

    port = free_port()
    bridge.extra_config = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    bridge.add_set(text_set("locked", 1))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 1)
    assert "batches_failing" not in _health(port)[1]
    operator = sqlite3.connect(bridge.store_path, timeout=30, isolation_level=None)
    operator.execute("BEGIN EXCLUSIVE")
    try:
        await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="while locked"))
        deadline = time.monotonic() + 60
        while "batches_failing" not in (health := _health(port)[1]):
            assert time.monotonic() < deadline, health
            await asyncio.sleep(0.5)
        assert "locked" in health["batches_failing"]["error"], health
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert _sample(response.read().decode(), "askwright_bridge_batches_failing_seconds") >= 0
    finally:
        operator.execute("ROLLBACK")
        operator.close()
    assert (await bridge.wait_answer("locked", "q0", timeout=60))["text"] == "while locked"
    deadline = time.monotonic() + 30
    while "batches_failing" in (health := _health(port)[1]):
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.5)


async def test_an_appservice_started_while_the_homeserver_is_down_answers_health_not_ready(tmp_path):
    # In appservice mode /health is the appservice listener's, opened only
    # once the homeserver answered: a start during its outage refused every
    # probe's connection (read as dead, and restarted), and came up 20 s late.
    from helpers.attack import appservice_storm_bridge, start_appservice_synapse

    server = start_appservice_synapse(tmp_path / "hs")
    person = Person(server, server.register(unique("person")))
    (tmp_path / "bridge").mkdir()
    bridge = appservice_storm_bridge(server, tmp_path / "bridge", [person])
    bridge.add_set(text_set("down", 1))
    port = int(server.appservice["listen"].rsplit(":", 1)[1])
    try:
        server.stop()
        bridge.start()
        status, health = await _health_while_down(bridge, port, 20)
        assert (status, health["live"], health["ready"], health["waiting_for"]) == (503, True, False, "homeserver")
        await asyncio.sleep(12)  # the bridge's asking for its user backs off meanwhile
        server.start()
        questions = await bridge.wait_questions(person, 1, timeout=60)
        await person.send(bridge.room_id, answer_content(questions[("q0", 1)], text="after the start"))
        assert (await bridge.wait_answer("down", "q0", timeout=30))["text"] == "after the start"
        status, health = _health(port)
        assert (status, health["ready"]) == (200, True), health
    finally:
        bridge.kill()
        await person.close()
        server.stop()
