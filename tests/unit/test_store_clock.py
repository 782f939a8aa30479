"""Times one instance writes and another judges come from PostgreSQL's clock.

Two instances on one database (the leader and its hot standby), the first on
a machine whose wall clock is ten minutes off: the webhook retry it schedules
is due when the other instance looks a backoff later (not ten minutes late),
and an encrypted event it keeps waiting for its keys is still waited on by
the other instance (not refused ten minutes early)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from nio import AsyncClient

from bridge.agents.outbox import due
from bridge.agents.sets import AgentSets
from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import client_config
from helpers.agents import one_question
from helpers.pgstore import fresh_schema

SKEW = 600.0  # the first machine's wall clock, ten minutes off


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _unreachable(*_args, **_kwargs):
    raise OSError("the homeserver is unreachable")  # nio itself would retry for ever


def _two_instances(postgres_server) -> tuple[Store, Store]:
    url = fresh_schema(postgres_server)
    return (Store("unused", url=url, password=postgres_server.password),
            Store("unused", url=url, password=postgres_server.password))


def _skewed(monkeypatch, seconds: float) -> None:
    """This machine's wall clock from now on is ``seconds`` off (the first instance's)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


# The first instance, in a process of its own whose wall clock runs SKEW
# seconds fast from before anything is imported (as on another machine): it
# queues one webhook and makes one attempt, refused, which schedules a retry.
FAST_INSTANCE = """
import asyncio, sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[4])
from bridge.agents.outbox import OutboxHook
from bridge.agents.webhooks import Deliverer
from bridge.service.config import Agent
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import LogEntry, Store

async def main():
    store = Store("unused", url=sys.argv[1], password=sys.argv[2])
    agents = {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}
    with store.transaction():
        OutboxHook(store, agents)(LogEntry("$answer", "!r", "@p:hs", "answer_event", "accepted", set_id="plan",
                                           set_dir=sys.argv[3], qid="branch", record={}))
    deliverer = Deliverer(store, agents, Metrics(), drop_after=3600, timeout=2, allow_private=True)
    stop = asyncio.Event()
    task = asyncio.ensure_future(deliverer.run(stop))
    for _ in range(200):
        if store.db.execute("SELECT attempts FROM webhook_outbox").fetchone()[0] >= 1:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await task

asyncio.run(main())
"""


def test_a_webhook_retry_scheduled_by_a_skewed_instance_is_due_for_the_other(tmp_path: Path, postgres_server) -> None:
    url = fresh_schema(postgres_server)
    sets = AgentSets(tmp_path / "sets")
    sets.ask("a", "plan", one_question("plan"), callbacks=[f"http://127.0.0.1:{_closed_port()}/hook"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", FAST_INSTANCE, url, postgres_server.password,
                    str(tmp_path / "sets" / "plan"), str(SKEW)], check=True, env=env, timeout=60)
    failed_at = int(time.time() * 1000)  # the other instance, on a machine whose clock is right
    right = Store("unused", url=url, password=postgres_server.password)
    attempts, next_at = right.db.execute("SELECT attempts, next_at FROM webhook_outbox").fetchone()
    assert attempts == 1
    # The first backoff is about a second (0.8 to 1.2 s): the retry is due then for the other
    # instance too, not ten minutes later.
    assert next_at - failed_at <= 1500
    assert [d.key for d in due(right, failed_at + 1500)] == ["answer.accepted:$answer"]
    right.close()


async def test_an_event_kept_for_its_keys_by_a_skewed_instance_is_still_waited_on_by_the_other(
        tmp_path: Path, postgres_server, monkeypatch) -> None:
    slow, right = _two_instances(postgres_server)
    settings = Encryption(grace="300s")
    clients = []
    for name in ("one", "two"):
        client = AsyncClient("http://127.0.0.1:1", "@askbot:example.org", store_path=str(tmp_path / name),
                             config=client_config(encryption=True))
        (tmp_path / name).mkdir()
        client.restore_login("@askbot:example.org", "BRIDGE", "token")
        client.to_device = _unreachable  # type: ignore[method-assign] - the key requests go nowhere
        clients.append(client)
    event = {"type": "m.room.encrypted", "event_id": "$secret", "room_id": "!r:example.org",
             "sender": "@person:example.org", "origin_server_ts": int(time.time() * 1000),
             "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AAAA", "sender_key": "key",
                         "session_id": "session", "device_id": "PHONE"}}
    try:
        _skewed(monkeypatch, -SKEW)  # the first instance's machine runs ten minutes slow
        batch, _resolved = await Crypto(clients[0], slow, settings).screen([event], lambda user: False)
        assert batch == [] and [e["event_id"] for e, _seen in slow.undecrypted()] == ["$secret"]
        monkeypatch.undo()  # the other instance, on a machine whose clock is right
        # It waits (its long poll wakes for the grace period's end, about 300 s from
        # now), where a first_seen ten minutes in its past would have it refuse the
        # event at once.
        waits_ms = await Crypto(clients[1], right, settings).sync_timeout_ms(600_000)
        assert 295_000 <= waits_ms <= 300_000
    finally:
        for client in clients:
            await client.close()
        slow.close()
        right.close()
