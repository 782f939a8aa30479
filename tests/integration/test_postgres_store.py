"""The bridge on PostgreSQL against a real Synapse: an operator moves a
running bridge's SQLite store over with ``store migrate`` and carries on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.attack import text_set
from helpers.harness import answer_content, question_posts

pytestmark = pytest.mark.integration


def migrate(bridge, url: str, password: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", "store", "migrate", "-c", str(bridge.config_path),
                           "--to", url], capture_output=True, text=True, cwd=bridge.workdir,
                          env={**os.environ, "ASKWRIGHT_BRIDGE_STORE_PASSWORD": password})


async def test_a_sqlite_store_moves_to_postgresql_and_the_bridge_carries_on(bridge, postgres_server):
    bridge.add_set(text_set("moved", 3))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 3)
    first = await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="before"))
    await bridge.wait_answer("moved", "q0")
    await bridge.alice.wait_notice(bridge.room_id, first)

    url = postgres_server.create_database()
    running = migrate(bridge, url, postgres_server.password)
    assert running.returncode == 2
    assert "the bridge is running" in running.stderr and "stop it" in running.stderr
    assert len(running.stderr.strip().splitlines()) == 1

    assert bridge.stop() == 0
    moved = migrate(bridge, url, postgres_server.password)
    assert moved.returncode == 0, moved.stderr
    rows = {line.split()[0]: line.split()[1] for line in moved.stdout.splitlines() if line.endswith(" rows")}
    assert rows["posted"] == "3" and int(rows["answer_log"]) >= 1 and rows["meta"] != "0"
    assert "answer log checksum" in moved.stdout and "verified" in moved.stdout
    assert postgres_server.password not in moved.stdout + moved.stderr

    again = migrate(bridge, url, postgres_server.password)
    assert again.returncode == 2 and "empty database" in again.stderr

    bridge.extra_config = {"store": {"path": str(bridge.store_path), "url": url,
                                     "password": postgres_server.password}}
    bridge.store_path.rename(bridge.store_path.with_suffix(".old"))  # nothing left to fall back on
    bridge.start()
    second = await bridge.alice.send(bridge.room_id, answer_content(questions[("q0", 1)], text="after"))
    record = await bridge.wait_answer("moved", "q0", rev=2)
    assert record["text"] == "after" and record["rev"] == 2
    await bridge.alice.wait_notice(bridge.room_id, second)
    events = await bridge.alice.messages(bridge.room_id)
    assert len(question_posts(events)) == 3, "a question was posted again after the move"
    assert len(await bridge.alice.notices_for(bridge.room_id, first)) == 1
