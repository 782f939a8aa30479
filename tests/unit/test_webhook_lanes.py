"""The real deliverer against a real store and real receivers: a URL that
accepts connections and never answers delays no other agent's webhook; a
PostgreSQL restart mid-delivery costs a pause, not the deliverer; and with
allow_private_callbacks off an inward address is never connected to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bridge.agents.circuit import PER_URL
from bridge.agents.outbox import OutboxHook, pending
from bridge.agents.sets import AgentSets
from bridge.agents.webhooks import Deliverer
from bridge.service.config import Agent
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import LogEntry, Store
from helpers.agents import SECRETS, Receiver, Silent, one_question
from helpers.pgstore import fresh_schema
from helpers.served import served
from helpers.waiting import until

AGENTS = {name: Agent(token=f"token-of-{name}-0123456789", webhook_secret=SECRETS[name]) for name in SECRETS}


def answered(hook: OutboxHook, store: Store, sets_root: Path, set_id: str, event_id: str) -> None:
    """An accepted answer's log entry, committed with its outbox rows as the pipeline does."""
    with store.transaction():
        hook(LogEntry(event_id, "!room", "@alice:hs", "answer_event", "accepted", set_id=set_id,
                      set_dir=str(sets_root / set_id), qid="branch", record={"choice": "main"}))


until = partial(until, timeout=30, every=0.02)


def stuck_beside_fine(tmp_path: Path, stuck_urls: list[str], fine_url: str,
                      stuck: int) -> tuple[Store, Deliverer, OutboxHook]:
    """The planner's set "stuck", ``stuck`` answers pending to ``stuck_urls``,
    beside another agent's set "fine" calling back ``fine_url``: the store,
    a deliverer not yet running, and the hook that queues (as the pipeline's)."""
    sets = AgentSets(tmp_path / "sets")
    sets.ask("planner", "stuck", one_question("stuck"), callbacks=stuck_urls)
    sets.ask("other", "fine", one_question("fine"), callbacks=[fine_url])
    store = Store(tmp_path / "store.sqlite")
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=30, allow_private=True)
    hook = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
    for n in range(stuck):
        answered(hook, store, tmp_path / "sets", "stuck", f"$stuck{n}")
    return store, deliverer, hook


def queued_to(tmp_path: Path, store: Store, url: str, count: int, drop_after: float = 3600) -> Deliverer:
    """``count`` answers of the planner's set "plan" queued for ``url``: the deliverer, not yet running."""
    sets = AgentSets(tmp_path / "sets")
    sets.ask("planner", "plan", one_question("plan"), callbacks=[url])
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=drop_after, timeout=5, allow_private=True)
    hook = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
    for n in range(count):
        answered(hook, store, tmp_path / "sets", "plan", f"$answer{n}")
    return deliverer


async def held_then_stopped(deliverer: Deliverer, tries: list[float]) -> None:
    """Run ``deliverer`` until its receiver has been tried once (and asked it
    to wait), then stop it, as a bridge is stopped."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    await until(lambda: len(tries) == 1, what="the first try")
    await asyncio.sleep(0.3)
    stop.set()
    await task


async def test_a_url_that_never_answers_delays_no_other_agents_webhook(tmp_path: Path) -> None:
    silent, receiver = Silent(), Receiver(SECRETS["other"])
    await silent.start()
    silent_url = silent.url
    await receiver.start()
    store, deliverer, hook = stuck_beside_fine(tmp_path, [silent_url], receiver.url, 100)
    try:
        async with running(deliverer):
            # The silent URL holds its fill of connections, each waiting out its 30 s.
            await until(lambda: silent.connections >= PER_URL, what="the silent URL was never tried")
            sent = time.monotonic()
            answered(hook, store, tmp_path / "sets", "fine", "$fine")
            (taken,) = await receiver.wait_for(1, timeout=30)
            took = time.monotonic() - sent
            assert took < 1.0, f"the other agent's webhook took {took:.1f} s behind 100 pending to a silent URL"
            assert taken["body"]["set"] == "fine" and taken["good"]
            assert silent.connections <= PER_URL  # one URL never holds more than its own lane
            assert pending(store) == 100
    finally:
        await receiver.close()
        await silent.close()
        store.close()


@pytest.mark.parametrize("restarted", [False, True], ids=["while-running", "after-a-restart"])
async def test_a_receiver_back_from_a_long_outage_gets_its_backlog_at_once(tmp_path: Path,
                                                                             restarted: bool) -> None:
    """Down for an hour, each delivery's backoff had reached 5 minutes: the
    receiver took the first one it was offered again, and the other 199
    waited out their own backoffs, one at a time, up to 5 minutes more."""
    receiver = Receiver(SECRETS["planner"])
    receiver.status = 503
    await receiver.start()
    store = Store(tmp_path / "store.sqlite")
    deliverer = queued_to(tmp_path, store, receiver.url, 200, drop_after=86_400)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        await receiver.wait_for(6, "attempts")
        if restarted:
            stop.set()
            await task
        # What an hour's outage leaves: every row tried 12 times, next in 5 minutes; the oldest due now.
        now_ms = int(store.clock.seconds() * 1000)
        with store.transaction(flush=False):
            store.db.execute("UPDATE webhook_outbox SET attempts=12, next_at=?", (now_ms + 300_000,))
            store.db.execute("UPDATE webhook_outbox SET next_at=? WHERE id=(SELECT MIN(id) FROM webhook_outbox)",
                             (now_ms,))
        receiver.status = 200
        if restarted:
            deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=86_400, timeout=5, allow_private=True)
            stop = asyncio.Event()
            task = asyncio.ensure_future(deliverer.run(stop))
        taken = await receiver.wait_for(200, timeout=20)
        assert sorted(t["key"] for t in taken) == sorted(f"answer.accepted:$answer{n}" for n in range(200))
        await until(lambda: pending(store) == 0, what="the outbox was not emptied")
    finally:
        stop.set()
        await task
        await receiver.close()
        store.close()


async def test_a_receiver_back_after_a_restart_gets_its_backlog_with_the_first_new_webhook(
        tmp_path: Path, store_backend: str) -> None:
    """The bridge restarted during a receiver's outage.  Back, the receiver
    took a new answer's webhook first (its backlog's rows were all put off
    for minutes), and only a retried row's take brought a backlog forward:
    the older answers waited out their backoffs, up to 5 minutes more, and
    came after the newer one."""
    receiver = Receiver(SECRETS["planner"])
    receiver.status = 503
    await receiver.start()
    store = Store(tmp_path / "store.sqlite")
    try:
        async with running(queued_to(tmp_path, store, receiver.url, 20, drop_after=86_400)):
            await receiver.wait_for(3, "attempts")
        # What an outage leaves: every row tried a dozen times, none due for 5 minutes.
        now_ms = int(store.clock.seconds() * 1000)
        with store.transaction(flush=False):
            store.db.execute("UPDATE webhook_outbox SET attempts=12, next_at=?", (now_ms + 300_000,))
        receiver.status = 200
        restarted = Deliverer(store, AGENTS, Metrics(), drop_after=86_400, timeout=5, allow_private=True)
        hook = OutboxHook(store, AGENTS, on_queued=restarted.wake.set)
        async with running(restarted):
            answered(hook, store, tmp_path / "sets", "plan", "$after-the-restart")
            taken = await receiver.wait_for(21, timeout=20)
        assert sorted(t["key"] for t in taken) == sorted(
            [f"answer.accepted:$answer{n}" for n in range(20)] + ["answer.accepted:$after-the-restart"])
    finally:
        await receiver.close()
        store.close()


async def test_deliveries_resume_after_a_postgresql_restart_without_restarting_the_deliverer(
        tmp_path: Path, postgres_server) -> None:
    receiver = Receiver(SECRETS["planner"])
    receiver.status = 503  # not taken at first: the rows stay in the outbox across the restart
    await receiver.start()
    store = Store(tmp_path / "store", url=fresh_schema(postgres_server), password=postgres_server.password)
    deliverer = queued_to(tmp_path, store, receiver.url, 20)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        await receiver.wait_for(3, "attempts")
        # Down for a few seconds, as a real restart is: every read and write of the deliverer fails meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, lambda: postgres_server.restart(down_for=3))
        receiver.status = 200
        taken = await receiver.wait_for(20, timeout=90)
        assert sorted(t["key"] for t in taken) == sorted(f"answer.accepted:$answer{n}" for n in range(20))
        assert not task.done(), "the deliverer ended"
        await until(lambda: pending(store) == 0, what="the outbox was not emptied")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await receiver.close()
        store.close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("allow_private", [False, True])
async def test_inward_addresses_are_never_connected_to_unless_allowed(tmp_path: Path, caplog, allow_private) -> None:
    """The same rows, refused at connect time without the key and taken with it."""
    seen: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        seen.append(request.host)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    urls = [f"http://127.0.0.1:{port}/hook", f"http://localhost:{port}/hook", f"http://[::ffff:127.0.0.1]:{port}/hook"]
    if _ipv6_loopback():
        await web.TCPSite(runner, "::1", port).start()
        urls.append(f"http://[::1]:{port}/hook")
    metadata = "http://169.254.169.254/latest/meta-data/"
    inward = ["http://10.0.0.1:9/hook", metadata]
    sets = AgentSets(tmp_path / "sets")
    sets.ask("planner", "plan", one_question("plan"), callbacks=[*urls, inward[0]])  # five at most
    agents = {**AGENTS, "planner": Agent(token="token-of-planner-0123456789", webhook_url=metadata,
                                         webhook_secret=SECRETS["planner"])}
    store = Store(tmp_path / "store.sqlite")
    metrics = Metrics()
    deliverer = Deliverer(store, agents, metrics, drop_after=3600, timeout=1, allow_private=allow_private)
    answered(OutboxHook(store, agents), store, tmp_path / "sets", "plan", "$answer")
    caplog.set_level(logging.WARNING, logger="bridge.agents.webhooks")
    try:
        async with running(deliverer):
            if allow_private:
                await until(lambda: len(seen) == len(urls),
                            what=f"only {len(seen)} of {len(urls)} loopback URLs took it")
            else:
                refused = lambda: {r.getMessage().split(" to ", 1)[1].split(" ", 1)[0]  # noqa: E731
                                   for r in caplog.records if "refused" in r.getMessage()}
                await until(lambda: len(refused()) == len(urls + inward), what="not every inward URL was refused")
                assert seen == []
                messages = " ".join(r.getMessage() for r in caplog.records)
                assert "loopback" in messages and "private" in messages and "metadata" in messages
    finally:
        await runner.cleanup()
        store.close()


async def test_a_url_that_keeps_timing_out_is_left_alone_then_probed_one_at_a_time(tmp_path: Path) -> None:
    silent = Silent()
    await silent.start()
    sets = AgentSets(tmp_path / "sets")
    sets.ask("planner", "stuck", one_question("stuck"), callbacks=[silent.url])
    store = Store(tmp_path / "store.sqlite")
    metrics = Metrics()
    deliverer = Deliverer(store, AGENTS, metrics, drop_after=3600, timeout=0.5, allow_private=True)
    hook = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
    for n in range(40):
        answered(hook, store, tmp_path / "sets", "stuck", f"$stuck{n}")
    try:
        async with running(deliverer):
            await until(lambda: silent.connections >= PER_URL, what="the silent URL was never tried")
            await asyncio.sleep(6)
            # Its first fill timed out and opened the circuit: since then, probes
            # only (1, 2 then 4 s apart), one at a time, not forty rows' retries.
            assert PER_URL < silent.connections <= PER_URL + 4
            circuit = deliverer.circuits["planner", silent.url]
            assert circuit.failures > PER_URL and len(deliverer.in_flight.get(("planner", silent.url), ())) <= 1
            assert pending(store) == 40
    finally:
        await silent.close()
        store.close()


async def test_a_2xx_is_recorded_when_its_status_comes_not_when_its_slow_body_ends(tmp_path: Path) -> None:
    """A receiver said 200 and then sent the rest of its answer slowly: the
    delivery was recorded only once that body ended or the timeout gave it
    up, and a bridge stopped or killed meanwhile sent the event again."""
    posts: list[float] = []
    finish = asyncio.Event()

    async def taken_then_slow(request: web.Request) -> web.StreamResponse:
        posts.append(time.monotonic())
        response = web.StreamResponse(status=200, headers={"Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"thanks, ")
        await finish.wait()  # the rest of its answer, not yet
        return response

    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", taken_then_slow)]) as port:
        sets = AgentSets(tmp_path / "sets")
        sets.ask("planner", "plan", one_question("plan"), callbacks=[f"http://127.0.0.1:{port}/hook"])
        deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=120, allow_private=True)
        answered(OutboxHook(store, AGENTS, on_queued=deliverer.wake.set), store, tmp_path / "sets", "plan", "$a")
        try:
            async with running(deliverer):
                # Taken while its body still comes: a stop or a kill now leaves nothing to send again.
                await until(lambda: pending(store) == 0, what="the 200 recorded before its body ended")
                assert len(posts) == 1
        finally:
            finish.set()
            store.close()


async def test_a_delivery_in_flight_when_the_bridge_stops_ends_first_and_is_not_sent_again(tmp_path: Path) -> None:
    """A stop (a restart, a deploy) cut off the deliveries in flight: a
    receiver a second into acting on an event took it, and got it again
    after the restart."""
    seen: list[str] = []

    async def acting(request: web.Request) -> web.Response:
        seen.append(json.loads(await request.read())["id"])
        await asyncio.sleep(1)  # it acts on the event, then answers
        return web.Response(status=204)

    store = Store(tmp_path / "store.sqlite")
    try:
        async with served([web.post("/hook", acting)]) as port:
            async with running(queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 1)):
                await until(lambda: len(seen) == 1, what="the delivery")
            # Stopped mid-delivery; started again.
            async with delivering(store, AGENTS):
                await until(lambda: pending(store) == 0, what="the outbox emptied")
        assert seen == ["answer.accepted:$answer0"]
    finally:
        store.close()


async def test_a_delivery_tried_for_days_still_gets_its_retry_recorded(tmp_path: Path) -> None:
    """The backoff doubled a float per attempt: past the 1,024th (a long
    webhook_drop_after, 5 minutes apiece) it overflowed, the attempt was
    never recorded, and the row stayed due: retried at every chance, with
    a traceback each time, instead of every 5 minutes."""
    tries: list[float] = []

    async def down(request: web.Request) -> web.Response:
        tries.append(time.monotonic())
        return web.Response(status=503)

    store = Store(tmp_path / "store.sqlite")
    try:
        async with served([web.post("/hook", down)]) as port:
            deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 1, drop_after=30 * 86_400)
            with store.transaction(flush=False):
                store.db.execute("UPDATE webhook_outbox SET attempts=1100")
            async with running(deliverer):
                await until(lambda: store.db.execute("SELECT attempts FROM webhook_outbox").fetchone()[0] == 1101,
                            what="the 1,101st attempt recorded")
            (next_at,) = store.db.execute("SELECT next_at FROM webhook_outbox").fetchone()
            assert next_at / 1000 - store.clock.seconds() > 200  # the longest backoff, give or take its jitter
            assert len(tries) == 1
    finally:
        store.close()


async def test_a_receiver_answering_with_a_huge_body_gets_its_connection_closed_not_read(tmp_path: Path) -> None:
    # Any token holder names the URL; the bridge read each answer whole,
    # 1.5 GB of a 500's body held in memory at every retry.
    pushed = 0
    done = asyncio.Event()

    async def flood(request: web.Request) -> web.StreamResponse:
        nonlocal pushed
        response = web.StreamResponse(status=500, headers={"Content-Length": str(1024 ** 3)})
        await response.prepare(request)
        chunk = b"x" * (1024 * 1024)
        try:
            while pushed < 1024 ** 3:
                await response.write(chunk)
                pushed += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        finally:
            done.set()
        return response

    app = web.Application()
    app.router.add_post("/hook", flood)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
    sets = AgentSets(tmp_path / "sets")
    sets.ask("planner", "flood", one_question("flood"), callbacks=[url])
    store = Store(tmp_path / "store.sqlite")
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=30, allow_private=True)
    hook = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
    answered(hook, store, tmp_path / "sets", "flood", "$a")
    try:
        async with running(deliverer):
            await asyncio.wait_for(done.wait(), 30)
            assert pushed < 64 * 1024 * 1024, f"the bridge took {pushed >> 20} MB of a receiver's answer"
            assert pending(store) == 1  # a 500: tried again later
    finally:
        await runner.cleanup()
        store.close()


async def fine_answered(hook: OutboxHook, store: Store, tmp_path: Path, receiver: Receiver) -> tuple[float, Any]:
    """The set "fine" answered: how long its webhook took to arrive, and what arrived."""
    sent = time.monotonic()
    answered(hook, store, tmp_path / "sets", "fine", "$fine")
    (taken,) = await receiver.wait_for(1, timeout=60)
    return time.monotonic() - sent, taken


async def ended(stop: asyncio.Event, task: asyncio.Future, receiver: Receiver, silents: list[Silent],
                store: Store) -> None:
    stop.set()
    await task
    await receiver.close()
    for silent in silents:
        await silent.close()
    store.close()


async def test_one_agent_naming_many_silent_urls_delays_no_other_agents_webhook(tmp_path: Path, monkeypatch) -> None:
    # Per-URL lanes did not help when one agent named many URLs: their
    # deliveries filled every slot in flight, and another agent's webhook
    # waited out a timeout. (The limits shrunk here: 8 in flight in all.)
    from bridge.agents import webhooks

    monkeypatch.setattr(webhooks, "MAX_IN_FLIGHT", 8)
    monkeypatch.setattr(webhooks, "PER_AGENT", 4, raising=False)
    silents = [Silent() for _ in range(4)]
    for silent in silents:
        await silent.start()
    receiver = Receiver(SECRETS["other"])
    await receiver.start()
    urls = [s.url.replace("/never", f"/n{i}") for i, s in enumerate(silents)]
    store, deliverer, hook = stuck_beside_fine(tmp_path, urls, receiver.url, 10)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        await until(lambda: sum(s.connections for s in silents) >= 4, what="the silent URLs were never tried")
        took, taken = await fine_answered(hook, store, tmp_path, receiver)
        assert took < 5.0, f"the other agent's webhook took {took:.1f} s behind one agent's silent URLs"
        assert taken["body"]["set"] == "fine"
    finally:
        await ended(stop, task, receiver, silents, store)


async def test_an_agent_with_thousands_of_silent_urls_holds_up_no_pass_of_the_deliverer(tmp_path: Path) -> None:
    """6,000 URLs of one agent, none answering, 8 webhooks due to each (sets
    of 5 callbacks, closed): with the agent's 64 in flight, every pass still
    read all 48,000 rows to start none, seconds on the store's thread that
    answers and the other agent's webhook (4.6-8.8 s late) waited behind."""
    silent = Silent()
    await silent.start()
    receiver = Receiver(SECRETS["other"])
    await receiver.start()
    store, deliverer, hook = stuck_beside_fine(tmp_path, [silent.url], receiver.url, 0)
    now_ms = int(store.clock.seconds() * 1000)
    with store.transaction():
        store.db.executemany(
            "INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts) "
            "VALUES (?, 'planner', ?, ?, ?, ?, 0)",
            [(f"k{n}-{k}", silent.url.replace("/never", f"/n{n}"), '{"x": "' + "a" * 300 + '"}', now_ms, now_ms)
             for n in range(6000) for k in range(8)])
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        await until(lambda: silent.connections >= 64, what="the planner's share never went out")
        took, taken = await fine_answered(hook, store, tmp_path, receiver)
        assert took < 2.0, f"the other agent's webhook took {took:.1f} s behind one agent's 6,000 silent URLs"
        assert taken["body"]["set"] == "fine"
        assert silent.connections == 64  # and no more than its share
    finally:
        await ended(stop, task, receiver, [silent], store)


async def test_an_agents_failing_callbacks_leave_room_for_its_own_healthy_ones(tmp_path: Path, monkeypatch) -> None:
    # The agent's cap on deliveries in flight kept its other agents out of
    # reach, but not its own healthy URL: many callbacks that accept and never
    # answer held every one of its slots, and its working webhook waited
    # behind their timeouts.  (The limits shrunk here: 4 in flight an agent.)
    from bridge.agents import webhooks

    monkeypatch.setattr(webhooks, "PER_AGENT", 4)
    silents = [Silent() for _ in range(8)]
    for silent in silents:
        await silent.start()
    receiver = Receiver(SECRETS["planner"])
    await receiver.start()
    sets = AgentSets(tmp_path / "sets")
    for half in (0, 1):  # at most five callbacks a set
        sets.ask("planner", f"stuck{half}", one_question(f"stuck{half}"),
                 callbacks=[s.url for s in silents[half * 4:half * 4 + 4]])
    sets.ask("planner", "fine", one_question("fine"), callbacks=[receiver.url])
    store = Store(tmp_path / "store.sqlite")
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=2, allow_private=True)
    hook = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
    for n in range(10):
        for half in (0, 1):
            answered(hook, store, tmp_path / "sets", f"stuck{half}", f"$stuck{half}.{n}")
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        # Every silent URL has timed out twice: none of them is news any more,
        # nor is any still in its first try (started before it was known to
        # fail, it counted as a healthy URL, and under load four such filled
        # the agent's slots by the time the healthy one came).
        await until(lambda: deliverer.failed._value.get() >= 2 * len(silents), what="the silent URLs timed out",
                    timeout=30)
        took, taken = await fine_answered(hook, store, tmp_path, receiver)
        assert took < 1.0, f"the agent's healthy webhook took {took:.1f} s behind its own silent callbacks"
        assert taken["body"]["set"] == "fine" and taken["good"]
    finally:
        await ended(stop, task, receiver, silents, store)


def test_an_answer_read_late_that_does_not_stand_says_so_with_the_record_that_does(tmp_path: Path) -> None:
    """Carol, on a server cut off a while, answered before Alice; Alice's
    answer was read first.  Carol's webhook came last, carrying her own pick:
    an agent acting on the latest webhook acted on an answer that did not
    stand (answers.json held Alice's, as the room's order says)."""
    from bridge.agents.outbox import due
    from bridge.agents.owner import OWNER_FILE
    from helpers.timeline import Room, answer

    room = Room(tmp_path)
    (room.set_dir / OWNER_FILE).write_text(json.dumps({"agent": "planner", "callbacks": ["https://hooks.example/p"]}))
    room.pipeline.on_logged = OutboxHook(room.store, AGENTS, clock=lambda: 5.0)
    room.deliver([answer("$alice", "@alice:hs", 2000, "stable")])
    room.deliver([answer("$carol", "@carol:hs", 1000, "main")])  # earlier in the room, read later
    bodies = {b["answer_event_id"]: b for b in (json.loads(row.body) for row in due(room.store, 2**62))}
    assert room.record()["choice"] == "stable"
    assert bodies["$carol"]["record"]["choice"] == "stable" and bodies["$carol"]["stands"] is False
    assert bodies["$alice"]["record"]["choice"] == "stable" and bodies["$alice"]["stands"] is True
    told = room.pipeline.words.notice_for(room.store.log_entry(
        room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$carol'").fetchone()[0]))["body"]
    assert told.endswith("It does not stand: the answer @alice:hs gave after it in the room does, "
                         "The stable branch."), told


def test_the_webhooks_waiting_are_counted_in_what_health_and_status_show(tmp_path: Path) -> None:
    # A receiver down for hours: the backlog was seen only in the log.
    from bridge.service.storage.heldback import counts, format_held, held_back

    # A working day of answers queued for a receiver that is down, not three.
    store, _deliverer, _hook = stuck_beside_fine(tmp_path, ["http://127.0.0.1:9/hook"], "http://127.0.0.1:9/fine", 500)
    held = held_back(store)
    assert counts(held)["webhooks_pending"] == 500 == pending(store)
    assert "500 webhook delivery(ies) pending, the oldest queued at " in format_held(held)


def busy_for(seconds: int, tries: list[float]) -> Any:
    """A receiver that answers every POST 429 with ``Retry-After: seconds``, noting when."""
    async def busy(request: web.Request) -> web.Response:
        tries.append(time.monotonic())
        return web.Response(status=429, headers={"Retry-After": str(seconds)})
    return busy


async def test_a_receiver_that_says_how_long_to_wait_is_not_asked_sooner(tmp_path: Path) -> None:
    """A 429 (or 503) with Retry-After was tried again after 1 s, then 2 s,
    as any failure, hammering a receiver that had said when to come back.
    Then only the row it answered waited: with 30 queued, each reopening of
    the circuit probed with another (8 tries in 20 s)."""
    from datetime import datetime, timedelta, timezone
    from email.utils import format_datetime

    tries: list[float] = []
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", busy_for(120, tries))]) as port:
        deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 30)
        try:
            async with running(deliverer):
                await until(lambda: len(tries) >= 1, what="the first try")
                await asyncio.sleep(0.5)
                first = len(tries)  # the lane's first fill, sent together
                await asyncio.sleep(7)  # plain failures are tried again after about 1, 2 and 4 s
                assert len(tries) == first <= PER_URL, f"{len(tries)} tries in 7 s of a receiver that asked for 120 s"
                asked = [next_at for (next_at,) in
                         store.db.execute("SELECT next_at FROM webhook_outbox WHERE attempts > 0")]
                assert len(asked) == first and min(asked) / 1000 - time.time() > 100
        finally:
            store.close()
    # The header's other form, an HTTP date; nonsense and other statuses ask nothing; never past the cap.
    from bridge.agents.webhooks import asked_to_wait

    now = time.time()
    soon = format_datetime(datetime.fromtimestamp(now, timezone.utc) + timedelta(seconds=60), usegmt=True)
    assert 55 <= asked_to_wait(503, soon, now) <= 61
    assert asked_to_wait(429, "soon", now) == asked_to_wait(500, "60", now) == 0
    assert asked_to_wait(429, "\u00b2", now) == 0  # a digit to str.isdigit, no number to float: it raised
    assert asked_to_wait(429, "86400", now) == 300


async def test_a_receivers_retry_after_holds_across_a_restart_for_what_is_queued_after_it(tmp_path: Path) -> None:
    """The hold lived only in memory: after a restart, the next event queued
    for that URL was POSTed at once, seconds after the receiver had asked to
    be left alone for five minutes (docs/agents.md: "never sooner")."""
    tries: list[float] = []
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", busy_for(300, tries))]) as port:
        deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 1)
        await held_then_stopped(deliverer, tries)
        # Started again, and another answer queued for that URL.
        restarted = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=5, allow_private=True)
        hook = OutboxHook(store, AGENTS, on_queued=restarted.wake.set)
        answered(hook, store, tmp_path / "sets", "plan", "$after-the-restart")
        try:
            async with running(restarted):
                await asyncio.sleep(4)
                assert len(tries) == 1, tries
        finally:
            store.close()


async def test_an_agent_naming_another_agents_url_delays_none_of_that_agents_webhooks(tmp_path: Path) -> None:
    """The planner names the other agent's receiver as its callback: the
    receiver refuses the planner's signature (401), and the circuit of that
    URL, shared by both agents, stayed open: the other agent's own webhook
    waited behind the planner's failures, with no bound."""
    receiver = Receiver(SECRETS["other"])
    await receiver.start()
    store, deliverer, hook = stuck_beside_fine(tmp_path, [receiver.url], receiver.url, 60)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        await until(lambda: sum(not a["good"] for a in receiver.attempts) >= PER_URL + 2, what="the circuit opened on the planner")
        took, taken = await fine_answered(hook, store, tmp_path, receiver)
        assert took < 2.0, f"the other agent's webhook took {took:.1f} s behind the planner's refused ones"
        assert taken["body"]["set"] == "fine" and taken["good"]
    finally:
        await ended(stop, task, receiver, [], store)


async def test_a_queued_callback_whose_host_no_name_can_be_fails_as_any_delivery_does(tmp_path: Path, caplog) -> None:
    """Queued before such URLs were refused at ask: the resolver's
    UnicodeError escaped the delivery, logged a traceback at every try and
    never recorded one (attempts 0, no backoff, no metric)."""
    store = Store(tmp_path / "store.sqlite")
    deliverer = queued_to(tmp_path, store, "http://" + "a" * 70 + ".example.com/hook", 1)
    try:
        async with running(deliverer):
            await until(lambda: store.db.execute("SELECT attempts FROM webhook_outbox").fetchone()[0] >= 1,
                        what="the failed try recorded")
    finally:
        store.close()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_receiver_that_redirects_is_logged_with_where_it_points_and_not_followed(tmp_path: Path, caplog,
                                                                                         status) -> None:
    """A receiver moved (http to https, a new path) answered a redirect: the
    log said "not taken (HTTP 308)" and nothing more, and the operator could
    not tell what webhook_url to name instead."""
    moved: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=status, headers={
            "Location": f"http://someone:pa55word@127.0.0.1:{request.url.port}/moved/hook?token=s3cret#part"})

    async def elsewhere(request: web.Request) -> web.Response:
        moved.append(request.method)
        return web.Response(status=200)

    caplog.set_level(logging.WARNING, logger="bridge.agents.webhooks")
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", redirect), web.route("*", "/moved/hook", elsewhere)]) as port:
        deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 1)
        try:
            async with running(deliverer):
                await until(lambda: store.db.execute("SELECT attempts FROM webhook_outbox").fetchone()[0] >= 1,
                            what="the redirected try recorded")
        finally:
            store.close()
    (said,) = [r.getMessage() for r in caplog.records if "not taken" in r.getMessage()]
    assert f"(HTTP {status} to http://127.0.0.1:{port}/moved/hook?…, not followed)" in said, said
    assert "pa55word" not in said and "someone" not in said and "s3cret" not in said and "part" not in said
    assert moved == []  # the policy stays: a redirect is never followed


def test_where_a_redirect_points_is_said_without_secrets_control_characters_or_length() -> None:
    from bridge.agents.webhooks import SHOWN_LOCATION, redirect_target

    base = "https://old.example/hook?sig=abc"
    assert redirect_target(base, "https://u:p@new.example:8443/in/hook?token=x#f") == \
        "https://new.example:8443/in/hook?…"
    assert redirect_target(base, "/hook/") == "https://old.example/hook/"  # relative: read against the URL
    # No line of the receiver's own in the log (urlsplit drops CR, LF and tabs; the rest is encoded).
    assert redirect_target(base, "https://new.example/a\r\nforged line\x1b[31m") == \
        "https://new.example/aforged%20line%1B[31m"
    assert redirect_target(base, None) == redirect_target(base, " ") == "nowhere (no Location)"
    assert redirect_target(base, "http://[::1") == "an unreadable Location"
    long = redirect_target(base, "https://new.example/" + "a" * 500)
    assert len(long) == SHOWN_LOCATION and long.endswith("…")


def planner_at(webhook_url: str | None) -> dict[str, Agent]:
    """The agents' config with the planner's webhook_url at ``webhook_url``."""
    return {"planner": Agent(token="token-of-planner-0123456789", webhook_secret=SECRETS["planner"],
                             webhook_url=webhook_url)}


def queued_before_a_url_change(tmp_path: Path, url: str, callbacks: list[str] | None = None) -> Store:
    """A store with three answers' webhooks queued while the planner's
    webhook_url was ``url`` (its set naming ``callbacks``)."""
    from bridge.agents.outbox import follow_webhook_urls

    before = planner_at(url)
    store = Store(tmp_path / "store.sqlite")
    follow_webhook_urls(store, before)
    AgentSets(tmp_path / "sets").ask("planner", "plan", one_question("plan"), *([callbacks] if callbacks else []))
    hook = OutboxHook(store, before)
    for n in range(3):
        answered(hook, store, tmp_path / "sets", "plan", f"$answer{n}")
    assert pending(store) == 3
    return store


@contextlib.asynccontextmanager
async def running(deliverer: Deliverer) -> AsyncIterator[Deliverer]:
    """``deliverer`` running for the block, stopped after it."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        yield deliverer
    finally:
        stop.set()
        await task


def delivering(store: Store, agents: dict[str, Agent]) -> contextlib.AbstractAsyncContextManager[Deliverer]:
    """A deliverer over ``store`` running for the block, stopped after it."""
    return running(Deliverer(store, agents, Metrics(), drop_after=3600, timeout=5, allow_private=True))


@pytest.mark.parametrize("changed_to", ["another URL", "none"])
async def test_webhooks_waiting_for_a_webhook_url_the_operator_changed_follow_the_change(tmp_path: Path,
                                                                                         changed_to) -> None:
    """The operator retires a webhook_url (a compromised endpoint, a move) and
    restarts: what was queued for it still went there, signed, for a day,
    and the new URL got none of it."""
    old, new = Receiver(SECRETS["planner"]), Receiver(SECRETS["planner"])
    await old.start()
    await new.start()
    store = queued_before_a_url_change(tmp_path, old.url)  # the bridge ran with the old URL
    try:
        async with delivering(store, planner_at(new.url if changed_to == "another URL" else None)):
            if changed_to == "another URL":
                await new.wait_for(3, timeout=30)
            await until(lambda: pending(store) == 0, what="the queue emptied")
        assert old.attempts == []
    finally:
        await old.close()
        await new.close()
        store.close()


async def test_webhooks_that_follow_a_changed_webhook_url_go_at_once_not_at_the_old_urls_backoff(
        tmp_path: Path, store_backend: str) -> None:
    """The operator moved webhook_url off a receiver that was down: the rows
    that followed the change kept the old URL's tries and its backoff, and
    the new URL, never tried, got them up to 5 minutes after the start."""
    new = Receiver(SECRETS["planner"])
    await new.start()
    store = queued_before_a_url_change(tmp_path, "http://127.0.0.1:9/down")
    try:
        # What the old URL's outage left: every row tried a dozen times, none due for 5 minutes.
        now_ms = int(store.clock.seconds() * 1000)
        with store.transaction(flush=False):
            store.db.execute("UPDATE webhook_outbox SET attempts=12, next_at=?", (now_ms + 300_000,))
        async with delivering(store, planner_at(new.url)):
            taken = await new.wait_for(3, timeout=20)
        assert sorted(t["key"] for t in taken) == [f"answer.accepted:$answer{n}" for n in range(3)]
    finally:
        await new.close()
        store.close()


def test_a_dead_receivers_backlog_past_drop_after_is_dropped_at_once_and_said_once(tmp_path: Path, caplog) -> None:
    """A day of webhooks to a receiver that never took one: the sweep dropped
    500 a minute, each in a transaction of its own (500 syncs of the disk on
    the store's thread the answers wait for), and logged each; a backlog
    growing faster than that never shrank."""
    import logging

    store = Store(tmp_path / "store.sqlite")
    with store.transaction():
        for n in range(3000):
            store.db.execute("INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts) "
                             "VALUES (?, 'planner', 'http://dead.example/hook', '{}', ?, ?, 40)",
                             (f"answer.accepted:${n}", n, 10 ** 13))
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=5, allow_private=True)
    caplog.set_level(logging.WARNING, logger="bridge.agents.webhooks")
    deliverer._sweep(3600 + 10)
    assert store.db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0] == 0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("3000 webhook(s) to dead.example dropped"), said
    store.close()


@pytest.mark.parametrize("removed", ["the agent", "its webhook_secret"])
async def test_a_removed_agents_webhook_backlog_is_dropped_at_once_and_said_once(tmp_path: Path, caplog, removed,
                                                                                 store_backend: str) -> None:
    """The operator removed an agent with 3,000 webhooks waiting and
    restarted: each was dropped as it came due, in a transaction of its own
    on the store's thread the answers wait for, with a log line each."""
    store = Store(tmp_path / "store.sqlite")
    now_ms = int(store.clock.seconds() * 1000)
    with store.transaction():
        for n in range(3000):
            store.db.execute("INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts) "
                             "VALUES (?, 'planner', 'http://127.0.0.1:9/hook', '{}', ?, ?, 0)",
                             (f"answer.accepted:${n}", now_ms, now_ms))
        # Another agent's, not due for an hour: they stay.
        for n in range(2):
            store.db.execute("INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts) "
                             "VALUES (?, 'other', 'http://127.0.0.1:9/other', '{}', ?, ?, 0)",
                             (f"answer.accepted:$other{n}", now_ms, now_ms + 3_600_000))
    agents = {"other": AGENTS["other"]}
    if removed == "its webhook_secret":
        agents["planner"] = Agent(token="token-of-planner-0123456789")
    caplog.set_level(logging.INFO, logger="bridge.agents.webhooks")
    try:
        async with delivering(store, agents) as deliverer:
            await until(lambda: pending(store) == 2, what="the removed agent's webhooks dropped")
        said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert said == ["3000 webhook(s) of agent planner dropped: the agent, or its webhook_secret, is no longer "
                        "in the config"], said[:5]
        assert deliverer.dropped._value.get() == 3000
        assert sorted(k for (k,) in store.db.execute("SELECT key FROM webhook_outbox")) == \
            ["answer.accepted:$other0", "answer.accepted:$other1"]
    finally:
        store.close()


async def test_a_dead_receivers_backlog_is_put_off_while_its_circuit_is_open(tmp_path: Path) -> None:
    """Its circuit open, a receiver's 2,000 rows stayed due: every pass of the
    deliverer (one after each delivery, anyone's) read them all again to leave
    them out, on the store's thread the answers wait for."""
    receiver = Receiver(SECRETS["planner"])
    receiver.status = 500  # no Retry-After: only the circuit holds it off
    await receiver.start()
    store = Store(tmp_path / "store.sqlite")
    deliverer = queued_to(tmp_path, store, receiver.url, 2000)
    try:
        async with running(deliverer):
            await until(lambda: any(c.open_until > deliverer.clock() for c in deliverer.circuits.values()),
                        what="the circuit never opened")

            def due_now() -> int:
                now_ms = int(deliverer.clock() * 1000)
                return store.db.execute("SELECT COUNT(*) FROM webhook_outbox WHERE next_at <= ?",
                                        (now_ms,)).fetchone()[0]

            await until(lambda: due_now() == 0, what="the backlog stayed due behind the open circuit")
    finally:
        await receiver.close()
        store.close()


def restarted_after_a_hold(tmp_path: Path, store: Store) -> tuple[Store, Deliverer, OutboxHook]:
    """The bridge stopped and started again on the same store: a new deliverer, and the hook that queues."""
    store.close()
    store = Store(tmp_path / "store.sqlite")
    deliverer = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=5, allow_private=True)
    return store, deliverer, OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)


async def test_a_receivers_retry_after_is_kept_on_either_store(tmp_path: Path, store_backend: str) -> None:
    """On PostgreSQL the hold was never kept: its meta key joined the agent
    and the URL with a NUL, which PostgreSQL text cannot hold; the write
    failed, and with it the putting off of the URL's queued rows.  After a
    restart the next event queued for the URL was POSTed at once, minutes
    before the receiver's Retry-After ran out."""
    from bridge.agents.outbox import lane_holds

    tries: list[float] = []
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", busy_for(300, tries))]) as port:
        url = f"http://127.0.0.1:{port}/hook"
        deliverer = queued_to(tmp_path, store, url, 1)
        await held_then_stopped(deliverer, tries)
        store, restarted, hook = restarted_after_a_hold(tmp_path, store)
        answered(hook, store, tmp_path / "sets", "plan", "$after-the-restart")
        try:
            async with running(restarted):
                await asyncio.sleep(3)
                assert len(tries) == 1, f"{len(tries)} tries of a receiver that asked for 300 s"
                (until_ms,) = lane_holds(store, int(store.clock.seconds() * 1000)).values()
                assert until_ms / 1000 - store.clock.seconds() > 290
        finally:
            store.close()


async def test_a_hold_a_sqlite_store_kept_under_its_old_key_still_holds_after_an_upgrade(tmp_path: Path) -> None:
    """A bridge upgraded while a receiver's hold ran (its key joining the agent and the URL with a NUL, as
    SQLite could keep it): the receiver is still not asked before its time, and the key goes once past."""
    from bridge.agents.outbox import HELD, lane_holds

    tries: list[float] = []
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", busy_for(300, tries))]) as port:
        url = f"http://127.0.0.1:{port}/hook"
        deliverer = queued_to(tmp_path, store, url, 1)
        now_ms = int(store.clock.seconds() * 1000)
        with store.transaction():
            store.set_meta(HELD + "planner\x00" + url, str(now_ms + 300_000))
            store.set_meta(HELD + "other\x00https://gone.example/hook", str(now_ms - 1))
        assert lane_holds(store, now_ms) == {("planner", url): now_ms + 300_000}
        assert [key for key, _ in store.meta_with_prefix(HELD)] == [HELD + "planner\x00" + url]
        try:
            async with running(deliverer):
                await asyncio.sleep(2)
                assert tries == []
        finally:
            store.close()


def test_a_hold_is_kept_and_read_back_on_either_store(tmp_path: Path, store_backend: str) -> None:
    from bridge.agents.outbox import hold_lane, lane_holds

    store = Store(tmp_path / "store.sqlite")
    now_ms = int(store.clock.seconds() * 1000)
    lanes = [("planner", "https://r.example/hook?a=1 b"), ("other", "https://r.example/ünï%00code")]
    try:
        for n, lane in enumerate(lanes):
            hold_lane(store, lane, now_ms + 1000 * (n + 1))
        assert lane_holds(store, now_ms) == {lanes[0]: now_ms + 1000, lanes[1]: now_ms + 2000}
        assert lane_holds(store, now_ms + 1500) == {lanes[1]: now_ms + 2000}
        assert lane_holds(store, now_ms) == {lanes[1]: now_ms + 2000}  # the past one forgotten
    finally:
        store.close()


async def test_a_hold_read_at_a_start_outlasts_the_first_pass(tmp_path: Path, store_backend: str) -> None:
    """A hold read at the start went into a circuit with no failures, which
    the first pass forgot as idle: an event queued a second after the
    restart was POSTed at once, minutes before the receiver's Retry-After."""
    tries: list[float] = []
    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", busy_for(300, tries))]) as port:
        deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 1)
        await held_then_stopped(deliverer, tries)
        store, restarted, hook = restarted_after_a_hold(tmp_path, store)
        try:
            async with running(restarted):
                await asyncio.sleep(1)  # the first pass has run
                answered(hook, store, tmp_path / "sets", "plan", "$after-the-first-pass")
                await asyncio.sleep(2)
                assert len(tries) == 1, f"{len(tries)} tries of a receiver that asked for 300 s"
        finally:
            store.close()


@pytest.mark.parametrize("attempted", [False, True], ids=["first-tries", "retries"])
async def test_a_2xx_already_in_flight_does_not_end_a_receivers_hold(tmp_path: Path, attempted: bool,
                                                                     monkeypatch) -> None:
    """A delivery sent before the receiver's limit was hit answered 204 after
    another's 429 asked for two minutes: the 204 cleared the hold, so the
    next event went at once; and when the 204 was a retry, every row of the
    URL was made due at once, the one the 429 answered with them: the rows'
    own times, which hold the URL when a start cannot read its holds, no
    longer did."""
    import bridge.agents.webhooks as webhooks

    tries: list[str] = []

    async def hook(request: web.Request) -> web.Response:
        tries.append(request.headers["Idempotency-Key"])
        if len(tries) == 1:
            await asyncio.sleep(1.0)  # taken before the limit was hit: answered late
            return web.Response(status=204)
        return web.Response(status=429, headers={"Retry-After": "120"})

    store = Store(tmp_path / "store.sqlite")
    async with served([web.post("/hook", hook)]) as port:
        deliverer = queued_to(tmp_path, store, f"http://127.0.0.1:{port}/hook", 2)
        if attempted:
            with store.transaction():
                store.db.execute("UPDATE webhook_outbox SET attempts=1")
        queue = OutboxHook(store, AGENTS, on_queued=deliverer.wake.set)
        async with running(deliverer):
            await until(lambda: len(tries) == 2, what="both tried")
            await until(lambda: pending(store) == 1, what="the 204 taken")
            if not attempted:
                answered(queue, store, tmp_path / "sets", "plan", "$after-the-204")
            await asyncio.sleep(2)
            assert len(tries) == 2, f"{len(tries)} tries of a receiver that asked for 120 s"
        if attempted:
            # Started again, its holds unreadable: the row the 429 answered waits on its own time.
            def unreadable(*_: Any) -> dict[Any, int]:
                raise RuntimeError("the store did not answer")

            monkeypatch.setattr(webhooks, "lane_holds", unreadable)
            restarted = Deliverer(store, AGENTS, Metrics(), drop_after=3600, timeout=5, allow_private=True)
            async with running(restarted):
                await asyncio.sleep(2)
                assert len(tries) == 2, f"{tries[1:]} tried again of a receiver that asked for 120 s"
        store.close()


@pytest.mark.parametrize("changed_to", ["another URL", "none"])
async def test_a_sets_callback_that_was_also_the_webhook_url_still_gets_its_webhooks_after_the_url_changes(
        tmp_path: Path, changed_to, store_backend: str) -> None:
    """A set naming its agent's webhook_url among its callbacks has one row
    an event for that URL: when the operator changed webhook_url, the row
    followed it (or, with none now, was dropped), and the callback the set
    named never got the event."""
    named, new = Receiver(SECRETS["planner"]), Receiver(SECRETS["planner"])
    await named.start()
    await new.start()
    # The bridge ran with the URL the set names too.
    store = queued_before_a_url_change(tmp_path, named.url, callbacks=[named.url])
    try:
        async with delivering(store, planner_at(new.url if changed_to == "another URL" else None)):
            await named.wait_for(3, timeout=30)  # the set's callback, as the set named it
            if changed_to == "another URL":
                await new.wait_for(3, timeout=30)  # and the agent's URL, now the new one
            await until(lambda: pending(store) == 0, what="the queue emptied")
    finally:
        await named.close()
        await new.close()
        store.close()
