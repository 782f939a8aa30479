"""The set folder misbehaves: read-only, full, or written by someone else
at the same time.  An answer that can't be written is kept in the store and
not acknowledged, its set is held back while the other sets and the sync
token move on; once the folder takes writes again, it lands.  Another writer that honours the lock loses nothing, and neither does
the bridge.

The tests run as root, so file modes stop nothing: the folder is made
immutable with ``chattr +i`` (ext4 and most Linux file systems), and a full
disk is a small tmpfs mounted over the set folder and filled up."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.attack import TornWatch, stray_files, text_set
from helpers.harness import Bridge, answer_content, store_rows
from helpers.sets import all_kinds_set

pytestmark = pytest.mark.integration

STUCK_SECONDS = 4


def sync_token(bridge: Bridge) -> str | None:
    rows = store_rows(bridge.store_path, "SELECT value FROM meta WHERE key='sync_token'")
    return rows[0][0] if rows else None


@contextlib.contextmanager
def immutable(folder: Path) -> Iterator[None]:
    """Nothing can be created, renamed or removed in ``folder``, root or not."""
    subprocess.run(["chattr", "+i", str(folder)], check=True, capture_output=True)
    try:
        probe = folder / ".probe"
        with pytest.raises(PermissionError):
            probe.write_text("x")  # the mechanism works here, or the test fails loudly
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True, capture_output=True)


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "256k") -> Iterator[None]:
    folder.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True,
                   capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True, capture_output=True)


def fill(folder: Path) -> Path:
    """Fill the file system ``folder`` is on to the last byte."""
    filler = folder / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        (folder / ".probe").write_bytes(b"x" * 8192)
    return filler


async def settled_token(bridge: Bridge) -> str | None:
    """The sync token once the bridge has nothing more to say (its own
    notices come back through the sync and move the token too)."""
    token = sync_token(bridge)
    while True:
        await asyncio.sleep(1.5)
        again = sync_token(bridge)
        if again == token:
            return token
        token = again


async def stuck_then_lands(bridge: Bridge, set_name: str, question: dict, failing: contextlib.AbstractContextManager,
                           reason: str) -> None:
    """While ``failing``, an answer to ``set_name`` is kept in the store, not
    acknowledged and not in answers.json; the set is held back on its own (an
    answer to the ``other`` set lands meanwhile and the sync token moves on);
    once the folder takes writes again, it lands and is acknowledged."""
    alice, room = bridge.alice, bridge.room_id
    first = await alice.send(room, answer_content(question, text="before"))
    await bridge.wait_answer(set_name, question["content"]["question"]["id"])
    await alice.wait_notice(room, first)
    token = await settled_token(bridge)
    answers_before = (bridge.sets_root / set_name / "answers.json").read_bytes()
    other = (await bridge.alice.questions(room))[("other", 1)]
    with failing:
        late = await alice.send(room, answer_content(question, text="while failing"))
        deadline = time.monotonic() + STUCK_SECONDS
        while time.monotonic() < deadline:
            bridge.check_alive()
            assert await alice.notices_for(room, late) == [], "an answer not on disk was acknowledged"
            await asyncio.sleep(0.5)
        assert (bridge.sets_root / set_name / "answers.json").read_bytes() == answers_before
        assert reason in bridge.log_text()
        assert store_rows(bridge.store_path, "SELECT outcome FROM answer_log WHERE event_id=?", late) == \
            [("accepted",)], "the answer is durable in the store"
        [(held_reason,)] = store_rows(bridge.store_path, "SELECT reason FROM held_set")
        assert reason in held_reason
        # Everything else moves on: another set's answer lands and is acknowledged, the token moves.
        elsewhere = await alice.send(room, answer_content(other, text="elsewhere"))
        await bridge.wait_answer("other", "other")
        await alice.wait_notice(room, elsewhere)
        assert sync_token(bridge) != token
    record = await bridge.wait_answer(set_name, question["content"]["question"]["id"], rev=2, timeout=40)
    assert (record["text"], record["source"]["event_id"]) == ("while failing", late)
    notice = await alice.wait_notice(room, late, timeout=30)
    assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"
    assert stray_files(bridge.sets_root / set_name) == []
    assert store_rows(bridge.store_path, "SELECT * FROM held_set") == []
    bridge.check_alive()


def other_set() -> dict:
    """A one-question set beside the one that fails."""
    qset = text_set("other", 1)
    qset["questions"][0]["id"] = "other"
    return qset


async def test_read_only_set_folder_holds_the_answer_until_writable(bridge):
    set_dir = bridge.add_set(all_kinds_set("kinds"))
    bridge.add_set(other_set())
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 9)
    await stuck_then_lands(bridge, "kinds", questions[("name", 1)], immutable(set_dir), "Operation not permitted")


async def test_full_disk_holds_the_answer_until_there_is_room(bridge):
    set_dir = bridge.sets_root / "full"
    with small_disk(set_dir):
        bridge.add_set(text_set("full", 2), name="full")
        bridge.add_set(other_set())
        bridge.start()
        questions = await bridge.wait_questions(bridge.alice, 3)

        @contextlib.contextmanager
        def full() -> Iterator[None]:
            filler = fill(set_dir)
            try:
                yield
            finally:
                filler.unlink()

        await stuck_then_lands(bridge, "full", questions[("q0", 1)], full(), "No space left on device")
        bridge.kill()


OTHER_WRITER = """
import sys
from bridge.answers.document import put_record
from bridge.answers.file import AnswersFile

folder, count = sys.argv[1], int(sys.argv[2])
answers = AnswersFile(folder)
for i in range(count):
    record = {"qid": f"web{i % 4}", "text": f"from the web page {i}", "q_rev": 1}
    answers.update(lambda doc, now, record=record: put_record(doc, record, now), "2026-11-30T12:00:00.000Z")
"""


async def test_another_writer_under_the_lock_loses_nothing_and_nobody_sees_a_torn_file(bridge):
    """askwright's own server writes the same answers.json (the web page) while
    the bridge writes answers from the room: each keeps every update."""
    set_dir = bridge.add_set(text_set("shared", 4))
    bridge.start()
    questions = await bridge.wait_questions(bridge.alice, 4)
    writes, answers_sent = 300, 80
    sent: list[tuple[str, str]] = []  # (qid, event id)

    async def answer_lane(lane: int) -> None:
        for i in range(lane, answers_sent, 4):
            qid = f"q{i % 4}"
            content = answer_content(questions[(qid, 1)], text=f"room {i}")
            sent.append((qid, await bridge.alice.send(bridge.room_id, content)))

    with TornWatch(set_dir / "answers.json") as watch:
        writer = await asyncio.create_subprocess_exec(sys.executable, "-c", OTHER_WRITER, str(set_dir), str(writes))
        await asyncio.gather(*(answer_lane(lane) for lane in range(4)))
        assert await asyncio.wait_for(writer.wait(), 60) == 0
        for qid in ("q0", "q1", "q2", "q3"):
            await bridge.wait_answer("shared", qid, rev=answers_sent // 4, timeout=60)
    assert watch.problems == [], watch.problems[:5]
    assert watch.reads > 50

    doc = json.loads((set_dir / "answers.json").read_text())
    for n in range(4):
        web = doc["answers"][f"web{n}"]
        assert web["rev"] == writes // 4, "an update of the other writer was lost"
        assert web["text"] == f"from the web page {writes - 4 + n}"
    logged = store_rows(bridge.store_path,
                        "SELECT qid, event_id FROM answer_log WHERE outcome='accepted' ORDER BY ts, seq")
    assert sorted(logged) == sorted(sent) and len(sent) == answers_sent
    last = {qid: event_id for qid, event_id in logged}  # the room's order (ts, then arrival): the latest wins
    for qid in ("q0", "q1", "q2", "q3"):
        record = doc["answers"][qid]
        assert record["rev"] == answers_sent // 4, "an answer of the bridge was lost"
        assert record["source"]["event_id"] == last[qid]
    # Every write, the other's and the bridge's (at least one), raised the file's rev by one.
    assert doc["rev"] > writes
    bridge.check_alive()
