"""Many sets: posting them, memory, start-up, and answers.json as it grows.

    python benchmarks/scale.py [--sets 1000] [--questions 10]

One Synapse, one run, each figure beside its reference:

* posting every question of ``--sets`` sets of ``--questions`` questions
  (each choice question is two sends: the question and its poll), beside a
  bare nio client sending the same question content one message at a time;
* the bridge's resident memory (VmRSS) with every set open, beside the same
  bridge with no set at all;
* start-up with every question recorded in the store (process start until
  ``/health`` says ready: the first sync handled), beside the same bridge
  starting on an empty store and an empty sets root;
* one answer written into an ``answers.json`` already holding N records
  (lock, read, change, write, fsync, rename), beside the bare atomic
  replace of the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _world import World, answer, question_set, send, world

from bridge.answers.document import dumps, put_records
from bridge.answers.file import AnswersFile
from bridge.wholefile import replace_whole
from bridge.devserver import free_port


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return round(fields["VmRSS"], 1), round(fields["VmHWM"], 1)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
            return json.loads(response.read()).get("ready") is True
    except (urllib.error.URLError, OSError, ValueError):
        return False


async def start_until_ready(w: World, config: Path, port: int, timeout: float = 300) -> float:
    started = time.perf_counter()
    w.start_bridge(config)
    while not ready(port):
        if time.perf_counter() - started > timeout:
            raise TimeoutError("the bridge did not turn ready")
        if w.bridge is not None and w.bridge.poll() is not None:
            raise RuntimeError("the bridge exited during start-up; see bridge.log")
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


async def nudge(w: World) -> None:
    """Something new in the room, so a restarted bridge's first sync returns at once
    instead of long-polling an idle room."""
    client = w.client(w.observer)
    await send(client, w.room_id, {"msgtype": "m.text", "body": "hello"})
    await client.close()


def posted_counts(db: sqlite3.Connection) -> tuple[int, int]:
    try:
        return db.execute("SELECT COUNT(*), COUNT(poll_event_id) FROM posted").fetchone()
    except sqlite3.OperationalError:
        return 0, 0


async def answer_first(w: World, db: sqlite3.Connection) -> tuple[float, int]:
    """A person answers the first question while the posting goes on: ms from
    the send until answers.json holds it, and how many questions were posted
    by then."""
    event_id, content = db.execute("SELECT event_id, content FROM posted ORDER BY rowid LIMIT 1").fetchone()
    question = {"event_id": event_id, "content": json.loads(content)}
    set_id = question["content"]["set"]["id"]
    answers = w.sets_root / set_id / "answers.json"
    client = w.client(w.person)
    sent = time.perf_counter()
    answer_id = await send(client, w.room_id, answer(question, "b"))
    await client.close()
    while answer_id not in (answers.read_text() if answers.exists() else ""):
        await asyncio.sleep(0.005)
    return (time.perf_counter() - sent) * 1000, posted_counts(db)[0]


async def bare_send_ms(w: World, content: dict[str, Any], count: int) -> float:
    """Milliseconds per message for a bare client sending one at a time."""
    client = w.client(w.observer)
    started = time.perf_counter()
    for _ in range(count):
        await send(client, w.room_id, content)
    elapsed = time.perf_counter() - started
    await client.close()
    return elapsed / count * 1000


async def measure(w: World, sets: int, questions: int, bare_sample: int = 300,
                  timeout: float = 7200) -> dict[str, Any]:
    total = sets * questions
    w.sets_root = w.base / "sets-scale"
    for n in range(sets):
        w.add_set(question_set(f"scale{n:04d}", questions))
    store = w.base / "scale.sqlite"
    port = free_port()
    config = w.config(store={"path": str(store)}, metrics={"enabled": True, "listen": f"127.0.0.1:{port}"})

    # Posting.
    started = time.perf_counter()
    w.start_bridge(config)
    db: sqlite3.Connection | None = None
    while db is None:
        if store.exists():
            db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        else:
            await asyncio.sleep(0.05)
    posted = polls = 0
    answered: asyncio.Task | None = None
    while (posted, polls) != (total, total):
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"only {posted} of {total} questions posted")
        await asyncio.sleep(0.1)
        posted, polls = posted_counts(db)
        if answered is None and polls >= questions:
            # The first set is up while the others are still being posted.
            answered = asyncio.ensure_future(answer_first(w, db))
    post_s = time.perf_counter() - started
    question = db.execute("SELECT content FROM posted LIMIT 1").fetchone()[0]
    assert answered is not None
    answer_ms, answered_at_posted = await answered
    db.close()
    await asyncio.sleep(2)
    rss, hwm = rss_mb(w.bridge.pid)
    w.stop_bridge(grace=10)

    # Start-up with every question recorded.
    await nudge(w)
    startup_s = await start_until_ready(w, config, port)
    await asyncio.sleep(1)
    rss_started, _ = rss_mb(w.bridge.pid)
    w.stop_bridge(grace=10)

    # The references: the same bridge with no set and an empty store; a bare
    # client sending question events one at a time.
    w.sets_root = w.base / "sets-none"
    w.sets_root.mkdir(exist_ok=True)
    empty = w.config(store={"path": str(w.base / "scale-empty.sqlite")},
                     metrics={"enabled": True, "listen": f"127.0.0.1:{port}"})
    await nudge(w)
    empty_startup_s = await start_until_ready(w, empty, port)
    await asyncio.sleep(1)
    rss_empty, _ = rss_mb(w.bridge.pid)
    w.stop_bridge(grace=10)
    bare_ms = await bare_send_ms(w, json.loads(question), bare_sample)

    return {
        "sets": sets, "questions": total, "sends": posted + polls,
        "post_s": round(post_s, 1), "post_ms_per_question": round(post_s / total * 1000, 2),
        "answer_during_posting_ms": round(answer_ms, 1), "posted_when_answered": answered_at_posted,
        "bare_ms_per_send": round(bare_ms, 2), "bare_equiv_s": round(bare_ms * (posted + polls) / 1000, 1),
        "rss_mb": rss, "rss_peak_mb": hwm, "rss_after_restart_mb": rss_started, "rss_empty_mb": rss_empty,
        "startup_s": round(startup_s, 3), "startup_empty_s": round(empty_startup_s, 3),
    }


def answers_growth(sizes: tuple[int, ...] = (10, 100, 1000, 10000), writes: int = 30) -> list[dict[str, Any]]:
    """Median ms for one answer written into answers.json holding ``size`` records."""
    rows = []
    now = "2026-11-30T12:00:00.000Z"
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="askwright-bench-answers-") as tmp:
            folder = Path(tmp)
            file = AnswersFile(folder, "growth")
            records = {f"q{n:05d}": _record(f"q{n:05d}", n) for n in range(size)}
            file.update(lambda doc, now: put_records(doc, records, now), now)
            times = []
            for n in range(writes):
                record = _record(f"q{n % size:05d}", n + size)
                started = time.perf_counter()
                file.update(lambda doc, now, r=record: put_records(doc, {r["qid"]: r}, now), now)
                times.append((time.perf_counter() - started) * 1000)
            data = dumps(file.load())
            floor = []
            for _ in range(writes):
                started = time.perf_counter()
                replace_whole(folder / "bare.json", data)
                floor.append((time.perf_counter() - started) * 1000)
            rows.append({"records": size, "bytes": len(data), "write_ms": round(statistics.median(times), 2),
                         "bare_replace_ms": round(statistics.median(floor), 2)})
    return rows


def _record(qid: str, n: int) -> dict[str, Any]:
    return {"qid": qid, "choice": "a", "label": "The first way", "matched_guess": True,
            "guess_revealed_before_pick": False, "q_rev": 1,
            "source": {"via": "matrix", "how": "answer_event", "room_id": "!room:localhost",
                       "event_id": f"$event{n:08d}", "sender": "@person:localhost", "ts": 1764500000000 + n}}


def print_rows(row: dict[str, Any], growth: list[dict[str, Any]]) -> None:
    print(f"posting {row['questions']} questions of {row['sets']} sets ({row['sends']} sends): {row['post_s']} s, "
          f"{row['post_ms_per_question']} ms per question; bare client {row['bare_ms_per_send']} ms per send "
          f"({row['bare_equiv_s']} s for as many sends)")
    print(f"an answer to the first set, sent while the posting went on: durable after "
          f"{row['answer_during_posting_ms']} ms ({row['posted_when_answered']} of {row['questions']} "
          f"questions posted by then)")
    print(f"resident memory with {row['sets']} open sets: {row['rss_mb']} MB (peak {row['rss_peak_mb']} MB, "
          f"after a restart {row['rss_after_restart_mb']} MB); with no set: {row['rss_empty_mb']} MB (target <= 120)")
    print(f"start-up with {row['questions']} recorded questions: {row['startup_s']} s; "
          f"empty store: {row['startup_empty_s']} s (target <= 2)")
    for g in growth:
        print(f"one answer into answers.json of {g['records']:>6} records ({g['bytes']:>9} bytes): "
              f"{g['write_ms']} ms; bare atomic replace {g['bare_replace_ms']} ms")


async def main(sets: int, questions: int) -> dict[str, Any]:
    async with world() as w:
        row = await measure(w, sets, questions)
    growth = answers_growth()
    print_rows(row, growth)
    return {**row, "answers_growth": growth}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=1000)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--growth-only", action="store_true", help="only the answers.json measure (no Synapse)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    if args.growth_only:
        result: Any = answers_growth()
        for g in result:
            print(g)
    else:
        result = asyncio.run(main(args.sets, args.questions))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
