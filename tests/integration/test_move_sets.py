"""The sets folder moved (a new disk, another mount path), against a real
Synapse: the store knows each set by its folder's path, so a bridge started
on the new root would close every question in the room and post it again.
It refuses to start instead, naming the command that moves the store's
paths with the folders; after it, the questions stay as they were posted
and keep taking answers."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest

from helpers.attack import text_set
from helpers.harness import Bridge, answer_content

pytestmark = pytest.mark.integration


def move_sets(bridge: Bridge, old_root: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bridge", "store", "move-sets", "-c", str(bridge.config_path),
                           "--from", old_root], capture_output=True, text=True, timeout=60)


async def test_sets_moved_to_another_root_keep_their_questions_and_answers(bridge, tmp_path):
    alice, room = bridge.alice, bridge.room_id
    try:
        bridge.add_set(text_set("alpha", 2))
        bridge.start()
        posted = await bridge.wait_questions(alice, 2)
        await alice.send(room, answer_content(posted[("q0", 1)], text="before the move"))
        await bridge.wait_answer("alpha", "q0")
        assert bridge.stop() == 0
        old_root = str(bridge.sets_root)
        shutil.move(old_root, tmp_path / "disk2")
        bridge.sets_folder = "disk2"

        bridge.start()  # on the new root, before the store knows: refused, nothing posted or closed
        assert bridge.process.wait(60) == 1
        said = bridge.log_text()
        assert f"askwright-bridge store move-sets -c <config> --from {old_root}" in said
        assert "question posted" not in said.split("--- start 2 ---")[1]

        moved = move_sets(bridge, old_root)
        assert moved.returncode == 0, moved.stderr
        assert f"moved 1 set folder from {old_root} to {bridge.sets_root}" in moved.stdout
        assert move_sets(bridge, old_root).returncode == 2  # nothing left there to move

        bridge.start()
        await alice.send(room, answer_content(posted[("q1", 1)], text="after the move"))
        record = await bridge.wait_answer("alpha", "q1")
        assert record["text"] == "after the move"
        answers = json.loads((bridge.sets_root / "alpha" / "answers.json").read_text())["answers"]
        assert answers["q0"]["text"] == "before the move"
        await asyncio.sleep(2)  # a pass of the sets after the start has had time to (wrongly) post or close
        since = bridge.log_text().split("--- start 3 ---")[1]
        assert "question posted" not in since and "question closed" not in since
    finally:
        bridge.kill()
