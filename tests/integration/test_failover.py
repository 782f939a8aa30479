"""Leader and standby: two instances on one PostgreSQL store against a real
Synapse.  One leads, the other says it stands by; the standby takes over
when the leader is killed or paused, and a paused leader that comes back
writes nothing and stands by."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from helpers.attack import text_set
from helpers.failover import Cluster
from helpers.harness import answer_content, unique

pytestmark = pytest.mark.integration


@pytest.fixture
async def cluster(synapse, postgres_server, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    alice = person()
    room_id = synapse.create_room(bot["access_token"], invite=[alice.user_id])
    synapse.join(alice.token, room_id)
    made = Cluster(synapse=synapse, postgres=postgres_server, workdir=tmp_path, room_id=room_id, bot=bot)
    made.alice = alice
    yield made
    made.stop_all()


async def role_of(cluster, instance, role: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (cluster.health(instance) or {}).get("role") != role:
        instance.check_alive()
        assert time.monotonic() < deadline, instance.log_text()[-3000:]
        await asyncio.sleep(0.1)


def status(instance) -> dict:
    done = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(instance.config_path), "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


async def test_one_leads_the_other_stands_by_and_takes_over_a_killed_then_a_paused_leader(cluster):
    alice, room = cluster.alice, cluster.room_id
    cluster.add_set(text_set("shared", 3))
    first, second = cluster.add(), cluster.add()
    first.start()
    assert await cluster.leader() is first
    second.start()
    questions = await first.wait_questions(alice, 3)
    await role_of(cluster, second, "standby")
    assert cluster.health(second) == {"live": True, "ready": False, "role": "standby"}
    assert "askwright_bridge_standby 1.0" in cluster.metrics(second)
    assert "askwright_bridge_standby 0.0" in cluster.metrics(first)
    assert [row["role"] for row in status(second)["instances"]] == ["leader", "standby"]

    await alice.send(room, answer_content(questions[("q0", 1)], text="one"))
    await cluster.wait_answer("shared", "q0", 1)

    # kill -9: the standby leads within 10 s and takes the next answer.
    first.kill()
    died = time.monotonic()
    assert await cluster.leader(timeout=10) is second
    print(f"killed leader replaced in {time.monotonic() - died:.1f} s")
    answered = await alice.send(room, answer_content(questions[("q0", 1)], text="two"))
    assert (await cluster.wait_answer("shared", "q0", 2))["text"] == "two"
    await alice.wait_notice(room, answered)

    # Paused: the other leads; answers sent meanwhile are its alone; the
    # paused one, resumed, finds it lost the lease and stands by.
    first.start()
    await role_of(cluster, first, "standby")
    second.process.send_signal(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        assert await cluster.leader(timeout=10, besides=second) is first
        print(f"paused leader replaced in {time.monotonic() - paused:.1f} s")
        during = [await alice.send(room, answer_content(questions[(q, 1)], text=f"while paused {q}"))
                  for q in ("q1", "q2")]
        await cluster.wait_answer("shared", "q2", 1)
    finally:
        second.process.send_signal(signal.SIGCONT)
    await role_of(cluster, second, "standby")
    assert "no longer leads" in second.log_text()
    third = await alice.send(room, answer_content(questions[("q1", 1)], text="after"))
    assert (await cluster.wait_answer("shared", "q1", 2))["text"] == "after"
    await alice.wait_notice(room, third)
    await asyncio.sleep(2)  # time for a stray write by the resumed instance, if it made one
    records = cluster.answers("shared")["answers"]
    assert (records["q0"]["rev"], records["q1"]["rev"], records["q2"]["rev"]) == (2, 2, 1)
    for event_id in [answered, *during, third]:
        assert len(await alice.notices_for(room, event_id)) == 1
    assert len([q for q in await alice.questions(room)]) == 3
    second.check_alive()
    first.check_alive()
