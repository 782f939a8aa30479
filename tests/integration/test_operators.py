"""For agents and operators, against a real Synapse: `wait` returns as soon as
a person's answer lands, exits 3 when none does; `status` sees it too."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from helpers.harness import answer_content, read_set
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

QUESTION_COUNT = 8


def start_wait(set_dir, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bridge", "wait", str(set_dir), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def finished(process: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    out, err = await asyncio.to_thread(process.communicate, timeout=timeout)
    return process.returncode, out, err


async def test_wait_returns_as_soon_as_a_real_answer_lands(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    set_dir = bridge.sets_root / "kinds"

    waiting = start_wait(set_dir, "--question", "branch", "--timeout", "120")
    await asyncio.sleep(2)
    assert waiting.poll() is None, waiting.communicate()  # nothing answered yet: it blocks

    # Another question's answer does not end the wait.
    await bridge.alice.send(bridge.room_id, answer_content(questions[("name", 1)], text="Borealis"))
    await bridge.wait_answer("kinds", "name")
    await asyncio.sleep(1)
    assert waiting.poll() is None

    sent = time.monotonic()
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="stable"))
    code, out, err = await finished(waiting, timeout=30)
    elapsed = time.monotonic() - sent
    assert code == 0, err
    # The answer travels alice -> Synapse -> the bridge's sync -> answers.json -> wait.
    assert elapsed < 10, elapsed
    view = json.loads(out)
    branch = next(a for a in view["answers"] if a["qid"] == "branch")
    assert (branch["choice"], branch["state"], branch["stale"]) == ("stable", "answered", False)
    # Exactly what read prints (nobody else is answering: the file is unchanged since).
    assert view == read_set(set_dir)


async def test_wait_until_all_and_exit_3_on_timeout(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    set_dir = bridge.sets_root / "kinds"

    started = time.monotonic()
    code, out, err = await finished(start_wait(set_dir, "--question", "takes", "--timeout", "2"), timeout=30)
    assert code == 3, err
    assert time.monotonic() - started >= 2
    assert json.loads(out)["count"] == 0

    # One answer is not all of them.
    await bridge.alice.send(bridge.room_id, answer_content(questions[("takes", 1)], option_id="t2"))
    await bridge.wait_answer("kinds", "takes")
    code, out, _err = await finished(start_wait(set_dir, "--until", "all", "--timeout", "2"), timeout=30)
    assert code == 3
    assert json.loads(out)["count"] == 1

    # The same question answered: a wait for it is over at once.
    started = time.monotonic()
    code, out, _err = await finished(start_wait(set_dir, "--question", "takes", "--timeout", "30"), timeout=30)
    assert code == 0 and time.monotonic() - started < 10
    assert json.loads(out) == read_set(set_dir)


async def test_status_counts_what_was_posted_and_answered_while_the_bridge_runs(bridge):
    bridge.add_set(all_kinds_set("kinds"))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, QUESTION_COUNT)
    await bridge.alice.send(bridge.room_id, answer_content(questions[("branch", 1)], option_id="main"))
    await bridge.alice.send(bridge.room_id, answer_content(questions[("ship", 1)], option_id="unsure"))
    await bridge.wait_answer("kinds", "branch")
    await bridge.wait_answer("kinds", "ship")
    done = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(bridge.config_path), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)["sets"][0]
    assert {k: row[k] for k in ("set_id", "posted", "open", "answered", "unsure", "pending", "stale")} == \
        {"set_id": "kinds", "posted": QUESTION_COUNT, "open": QUESTION_COUNT, "answered": 1, "unsure": 1,
         "pending": QUESTION_COUNT - 2, "stale": 0}
    bridge.check_alive()
