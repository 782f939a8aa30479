"""Capacity: the highest answer rate the bridge keeps up with, beside a bare
client reading the same stream.

    python benchmarks/capacity.py [--rates 10 20 50 100 200] [--seconds 30] [--rooms 10] [--people 5]

One Synapse, one bridge (bot mode, as its own process).  ``--rooms`` rooms
with a set of ``--questions`` choice questions each and ``--people`` people
in every room; at each rate in turn the people answer open questions picked
at random, on a fixed schedule between them (none waits for the last to
land), for ``--seconds``.  Each answer is timed until ``answers.json`` holds
it (a watcher process on inotify over every set folder, ``soak.py``'s) and
until a bare client long-polling ``/sync`` in every room sees it.

A side keeps up with a rate when its p99 from the send is at most 1 s and
every answer sent reached it within ``LAND_S`` of the last send (for the
bridge: in its store's processed events, since an answer replaced by the
next one to its question in the same batch never shows in answers.json).
The rates go up until neither side keeps up.  Also printed: the bridge's
CPU time per answer at each rate (its process, from /proc).  The target
(issue 30): the bridge keeps up with at least 90% of the highest rate the
bare client keeps up with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from _world import World, answer, percentile, question_set, world
from latency import FileWatch, cpu_seconds
from soak import Observer, open_questions

import soak

OUT = Path(__file__).resolve().parent / "out"
P99_LIMIT_MS = 1000.0
LAND_S = 10.0  # after the last send, the time every answer has to reach each side


async def setup(w: World, rooms: int, questions: int, people: int) -> tuple[Path, Path, list[dict[str, str]]]:
    persons, room_ids = w.rooms_with_people("capacity", rooms, people)
    w.sets_root = w.base / "sets-capacity"
    w.sets_root.mkdir(exist_ok=True)
    for n in range(rooms):
        w.add_set(question_set(f"capacity{n}", questions))
    store = w.base / "capacity.sqlite"
    config = w.config(store={"path": str(store)}, rooms={"default": w.room_id,
                      "sets": {f"capacity{n}": room_id for n, room_id in enumerate(room_ids)}},
                      answerers=[p["user_id"] for p in persons] + [w.bot["user_id"]])
    return config, store, persons


def processed(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT event_id FROM processed")}


async def measure(w: World, rates: list[float], seconds: float, rooms: int = 10, questions: int = 10,
                  people: int = 5) -> dict[str, Any]:
    config, store, persons = await setup(w, rooms, questions, people)
    w.start_bridge(config)
    while not store.exists():
        await asyncio.sleep(0.1)
    db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    while True:  # the first posting: every question
        try:
            posted = db.execute("SELECT COUNT(*) FROM posted").fetchone()[0]
        except sqlite3.OperationalError:
            posted = 0
        if posted >= rooms * questions:
            break
        if w.bridge is None or w.bridge.poll() is not None:
            raise RuntimeError("the bridge exited during the posting; see bridge.log")
        await asyncio.sleep(0.5)
    watch = FileWatch(w.sets_root, script=soak.__file__)
    await watch.start()
    observer = Observer(w.client(w.observer))
    observer_task = asyncio.ensure_future(observer.run())
    clients = [w.client(p) for p in persons]
    await asyncio.sleep(1)
    pool = open_questions(db)
    rng = random.Random(30)
    steps = []
    for rate in rates:
        sent: dict[str, float] = {}
        errors = 0

        async def send_one(person: int, question: dict[str, Any], option: str) -> None:
            nonlocal errors
            at = time.perf_counter()
            response = await clients[person].room_send(question["room_id"], "m.room.message",
                                                       answer(question, option))
            if getattr(response, "event_id", None):
                sent[response.event_id] = at
            else:
                errors += 1

        assert w.bridge is not None
        cpu_before = cpu_seconds(w.bridge.pid)
        t0, gap, pending = time.perf_counter(), 1 / rate, []
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, t0 + n * gap - time.perf_counter()))
            pending.append(asyncio.ensure_future(send_one(n % people, rng.choice(pool), "ab"[n % 2])))
        sending_s = time.perf_counter() - t0  # above ``seconds`` when the sends themselves fell behind
        await asyncio.gather(*pending)
        deadline = time.perf_counter() + LAND_S
        while time.perf_counter() < deadline:
            if set(sent) <= observer.seen.keys() and set(sent) <= processed(db):
                break
            await asyncio.sleep(0.2)
        landed = processed(db) & set(sent)
        cpu = cpu_seconds(w.bridge.pid) - cpu_before
        bridge_ms = [(watch.seen[e] - at) * 1000 for e, at in sent.items() if e in watch.seen]
        bare_ms = [(observer.seen[e] - at) * 1000 for e, at in sent.items() if e in observer.seen]
        step = {
            "rate": rate, "sent": len(sent), "send_errors": errors, "sending_s": round(sending_s, 2),
            "bridge_landed": len(landed), "bare_seen": len(bare_ms), "timed_in_answers_json": len(bridge_ms),
            "bridge_p50_ms": round(percentile(bridge_ms, 50), 1) if bridge_ms else None,
            "bridge_p99_ms": round(percentile(bridge_ms, 99), 1) if bridge_ms else None,
            "bare_p50_ms": round(percentile(bare_ms, 50), 1) if bare_ms else None,
            "bare_p99_ms": round(percentile(bare_ms, 99), 1) if bare_ms else None,
            "bridge_cpu_ms_per_answer": round(cpu * 1000 / max(1, len(sent)), 2),
        }
        step["bridge_keeps_up"] = bool(sent) and len(landed) == len(sent) and bridge_ms != [] and \
            step["bridge_p99_ms"] <= P99_LIMIT_MS
        step["bare_keeps_up"] = bool(sent) and len(bare_ms) == len(sent) and step["bare_p99_ms"] <= P99_LIMIT_MS
        steps.append(step)
        print_step(step)
        if not step["bridge_keeps_up"] and not step["bare_keeps_up"]:
            break
        await asyncio.sleep(2)  # the next rate starts from a quiet room
    observer_task.cancel()
    await watch.stop()
    for client in clients + [observer.client]:
        await client.close()
    db.close()
    w.stop_bridge()
    best = {side: max([s["rate"] for s in steps if s[f"{side}_keeps_up"]], default=0) for side in ("bridge", "bare")}
    return {"rooms": rooms, "people": people, "questions_per_room": questions, "seconds": seconds, "steps": steps,
            "bridge_max_rate": best["bridge"], "bare_max_rate": best["bare"],
            "ratio": round(best["bridge"] / best["bare"], 2) if best["bare"] else None}


def print_step(s: dict[str, Any]) -> None:
    print(f"{s['rate']:>6g}/s  sent {s['sent']:>5} in {s['sending_s']:>6} s  bridge: landed {s['bridge_landed']:>5}, "
          f"p50 {s['bridge_p50_ms']} p99 {s['bridge_p99_ms']} ms, {s['bridge_cpu_ms_per_answer']} ms CPU/answer, "
          f"keeps up: {s['bridge_keeps_up']}  |  bare: seen {s['bare_seen']:>5}, p50 {s['bare_p50_ms']} "
          f"p99 {s['bare_p99_ms']} ms, keeps up: {s['bare_keeps_up']}", flush=True)


def print_report(r: dict[str, Any]) -> None:
    print(f"capacity, {r['rooms']} rooms, {r['people']} people: the bridge keeps up with {r['bridge_max_rate']:g} "
          f"answers/s, the bare client with {r['bare_max_rate']:g} (ratio {r['ratio']}; target >= 0.9)")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with world() as w:
        return await measure(w, args.rates, args.seconds, args.rooms, args.questions, args.people)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 20, 50, 100, 200], help="answers per second")
    parser.add_argument("--seconds", type=float, default=30, help="seconds of answering at each rate (30)")
    parser.add_argument("--rooms", type=int, default=10)
    parser.add_argument("--questions", type=int, default=10, help="open questions per room (10)")
    parser.add_argument("--people", type=int, default=5)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    sys.exit(0)
