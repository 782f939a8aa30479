"""answers.json on disk: the lock, atomic replace, and readers during writes."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import subprocess
import time
from pathlib import Path

import pytest

from bridge.answers import document
from bridge.answers.document import AnswersError
from bridge.answers.file import LOCK_NAME, TEMP_PREFIX, AnswersFile, remove_stray_temps
from bridge.wholefile import HOST, STRAY_SECONDS, TEMP_MARK

NOW = "2026-11-30T12:00:00.000Z"
INCREMENTS = 200


def put(record: dict):
    return lambda doc, now: document.put_record(doc, record, now)


def answer(choice: str = "t2", qid: str = "arrow") -> dict:
    return {"qid": qid, "choice": choice, "q_rev": 1}


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


# --- load / update ----------------------------------------------------------


def test_missing_file_loads_as_empty_document(tmp_path):
    assert AnswersFile(tmp_path, "takes").load() == document.empty("takes")


def test_set_id_defaults_to_the_folder_name(tmp_path):
    folder = tmp_path / "takes"
    folder.mkdir()
    assert AnswersFile(folder).load()["set"] == "takes"


def test_update_writes_the_document(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    new = af.update(put(answer()), NOW)
    assert new["rev"] == 1
    assert af.path.read_bytes() == document.dumps(new)
    assert af.load() == new
    assert (tmp_path / LOCK_NAME).exists()
    assert leftovers(tmp_path) == []


def test_update_that_changes_nothing_writes_nothing(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    af.update(lambda doc, now: document.drop_record(doc, "arrow", now), NOW)
    assert not af.path.exists()
    af.update(put(answer()), NOW)
    before = af.path.stat().st_mtime_ns
    assert af.update(lambda doc, now: doc, NOW)["rev"] == 1
    assert af.path.stat().st_mtime_ns == before


def test_update_refuses_a_rev_that_does_not_count_writes(tmp_path):
    af = AnswersFile(tmp_path, "takes")

    def sneaky(doc, now):
        new = document.put_record(doc, answer(), now)
        new["rev"] = 10
        return new

    with pytest.raises(AnswersError, match="rev"):
        af.update(sneaky, NOW)
    assert not af.path.exists()


def test_load_refuses_a_broken_file(tmp_path):
    (tmp_path / "answers.json").write_bytes(b'{"askwright": 1')
    with pytest.raises(AnswersError, match="not JSON"):
        AnswersFile(tmp_path).load()


# --- failed writes leave the old file and no temp file ----------------------


@pytest.mark.parametrize("victim", ["replace", "fsync", "write"])
def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch, victim):
    af = AnswersFile(tmp_path, "takes")
    af.update(put(answer("t2")), NOW)
    old = af.path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, victim, boom)
    with pytest.raises(OSError, match="No space"):
        af.update(put(answer("t5")), NOW)
    monkeypatch.undo()
    assert af.path.read_bytes() == old
    assert leftovers(tmp_path) == []


# --- the lock ---------------------------------------------------------------


def test_locked_takes_an_exclusive_flock(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    with af.locked():
        fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)


def _increment(doc: dict, now: str) -> dict:
    current = doc["answers"].get("counter")
    value = int(current["text"]) + 1 if current else 1
    return document.put_record(doc, {"qid": "counter", "text": str(value), "q_rev": 1}, now)


def _incrementer(folder: str, start, count: int) -> None:
    af = AnswersFile(folder, "count")
    start.wait()
    for _ in range(count):
        af.update(_increment, NOW)


def test_two_processes_lose_no_increment(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    workers = [ctx.Process(target=_incrementer, args=(str(tmp_path), start, INCREMENTS)) for _ in range(2)]
    for w in workers:
        w.start()
    start.set()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    doc = AnswersFile(tmp_path, "count").load()
    assert doc["answers"]["counter"]["text"] == str(2 * INCREMENTS)
    assert doc["answers"]["counter"]["rev"] == 2 * INCREMENTS
    assert doc["rev"] == 2 * INCREMENTS
    assert leftovers(tmp_path) == []


def _storm(folder: str, start, count: int) -> None:
    af = AnswersFile(folder, "storm")
    start.wait()
    for i in range(count):
        # Big notes make each write span many pages, so a torn read would show.
        note = f"{i} " + "x" * (1000 + (i % 7) * 3000)
        af.update(put({"qid": f"q{i % 5}", "note": note, "q_rev": 1}), NOW)


def test_reader_never_sees_a_torn_file(tmp_path):
    af = AnswersFile(tmp_path, "storm")
    af.update(put({"qid": "q0", "note": "first", "q_rev": 1}), NOW)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writer = ctx.Process(target=_storm, args=(str(tmp_path), start, 300))
    writer.start()
    start.set()
    reads = 0
    last_rev = 0
    deadline = time.monotonic() + 120
    while writer.is_alive() and time.monotonic() < deadline:
        data = af.read_bytes()
        assert data is not None  # the name never disappears mid-replace
        doc = document.parse(data)  # raises on torn JSON
        assert doc["rev"] >= last_rev
        last_rev = doc["rev"]
        reads += 1
    writer.join(120)
    assert writer.exitcode == 0
    assert reads > 0
    assert json.loads(af.path.read_bytes())["rev"] == 301


# --- what a writer killed mid-write leaves ------------------------------------


def _stuck_writer(folder: str, ready) -> None:
    """Writes answers.json and stops for good inside the write (before its fsync)."""
    def hang(fd: int) -> None:
        ready.set()
        time.sleep(600)

    os.fsync = hang
    AnswersFile(folder, "takes").update(put(answer("t5")), NOW)


def _writer_stuck_in_its_write(folder: Path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    writer = ctx.Process(target=_stuck_writer, args=(str(folder), ready))
    writer.start()
    assert ready.wait(60)
    return writer


def test_the_temp_file_of_a_writer_killed_mid_write_is_removed_and_a_live_ones_kept(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    af.update(put(answer("t2")), NOW)
    old = af.path.read_bytes()
    killed = _writer_stuck_in_its_write(tmp_path)
    killed.kill()  # kill -9 inside the write
    killed.join()
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].endswith(f".{killed.pid}")  # it names its writer
    assert remove_stray_temps(tmp_path) == left
    assert leftovers(tmp_path) == [] and af.path.read_bytes() == old

    # A writer still at work keeps its temp file; so does another machine's,
    # until it is too old to be anybody's write.
    live = _writer_stuck_in_its_write(tmp_path)  # it holds the set's lock
    try:
        mine = leftovers(tmp_path)
        elsewhere = tmp_path / f"{TEMP_PREFIX}another-host.4242"
        stale = tmp_path / f"{TEMP_PREFIX}another-host.4343"
        elsewhere.write_bytes(b"{")
        stale.write_bytes(b"{")
        long_ago = time.time() - STRAY_SECONDS - 60
        os.utime(stale, (long_ago, long_ago))
        assert remove_stray_temps(tmp_path, wait=False) == []  # the set's lock is the live writer's
        live.kill()
        live.join()
        assert sorted(remove_stray_temps(tmp_path)) == sorted([*mine, stale.name])
        assert leftovers(tmp_path) == [elsewhere.name]
    finally:
        live.kill()
        live.join()
    # A live process's temp file written outside the lock (questions.json, closed by an admin).
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        questions = tmp_path / f"questions.json{TEMP_MARK}{HOST}.{sleeper.pid}"
        questions.write_bytes(b"{")
        assert remove_stray_temps(tmp_path) == []
    finally:
        sleeper.kill()
        sleeper.wait()
    assert remove_stray_temps(tmp_path) == [questions.name]


def test_a_byte_order_mark_another_writer_put_before_answers_json_is_passed_over():
    # questions.json's was passed over; answers.json's refused the file
    # ("Unexpected UTF-8 BOM"), the bridge's own next write with it.
    parsed = document.parse("\ufeff".encode() + b'{"askwright": 1, "set": "s", "rev": 0, "answers": {}}')
    assert parsed["set"] == "s" and parsed["answers"] == {}
