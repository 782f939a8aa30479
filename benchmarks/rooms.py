"""Many rooms, one open set each: memory, CPU while idle, and an answer's latency.

    python benchmarks/rooms.py [--rooms 1000] [--idle 60] [--answers 10]

One Synapse, one bridge (bot mode, as its own process).  ``--rooms`` rooms,
each with the bot and one person, and one set of one choice question mapped
to each room (``rooms.sets``).  The bench starts the bridge, waits until every
question and its poll are posted, then measures, beside a bare matrix-nio
client in a process of its own syncing the bot's own account (a device of
its own, so it is in exactly the rooms the bridge is in):

* resident memory (VmRSS) of each process once everything is posted;
* the CPU seconds (utime + stime from /proc/<pid>/stat) each process spends
  over ``--idle`` seconds with nothing sent, scaled to a minute;
* ``--answers`` answers, one at a time, to questions in rooms picked at
  random: send -> durable in ``answers.json`` (an inotify watcher process,
  ``soak.py``'s) beside send -> seen by the bare client, p50 and max, and
  per answer the bridge's durable time minus the bare client's seen time.

Creating the rooms on Synapse is itself slow; the seconds it took are
printed and kept with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nio import AsyncClient, SyncResponse

from _world import World, answer, percentile, question_set, world
from latency import FileWatch, LineProcess, cpu_seconds
from soak import open_questions

import soak

CREATORS = 4  # concurrent createRoom / join requests while setting up


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for {pid}")


def make_rooms(w: World, count: int) -> tuple[list[str], float]:
    """``count`` rooms (the world's room first) the bot created and the person
    joined, and the seconds creating the others took."""
    started = time.perf_counter()

    def one(n: int) -> str:
        room_id = w.synapse.create_room(w.bot["access_token"], invite=[w.person["user_id"]])
        w.synapse.join(w.person["access_token"], room_id)
        if n % 250 == 249:
            print(f"rooms: {n + 2} created after {time.perf_counter() - started:.0f} s", flush=True)
        return room_id

    with ThreadPoolExecutor(CREATORS) as pool:
        room_ids = [w.room_id] + list(pool.map(one, range(count - 1)))
    return room_ids, time.perf_counter() - started


class BareClient(LineProcess):
    """The reference: ``rooms.py --bare`` as its own process, so its CPU and
    memory are its own.  Notes when each timeline event reaches it (it
    prints "synced" once its first, full sync is done)."""

    def __init__(self, url: str, user_id: str, token: str):
        super().__init__([sys.executable, str(Path(__file__).resolve()), "--bare", url, user_id, token])


async def bare_main(url: str, user_id: str, token: str) -> None:
    """A bare client: a full first sync, then long polls, one line per new event."""
    client = AsyncClient(url, user_id)
    client.access_token = token
    first = await client.sync(timeout=0, full_state=True)
    assert isinstance(first, SyncResponse), first
    since = first.next_batch
    print("synced", flush=True)
    while True:
        response = await client.sync(timeout=30000, since=since)
        now = time.perf_counter()
        if isinstance(response, SyncResponse):
            since = response.next_batch
            for room in response.rooms.join.values():
                for event in room.timeline.events:
                    print(event.event_id, now, flush=True)


async def measure(w: World, rooms: int = 1000, idle_s: float = 60, answers: int = 10,
                  gap_s: float = 1.0) -> dict[str, Any]:
    print(f"rooms: creating {rooms} rooms ...", flush=True)
    room_ids, create_s = await asyncio.get_running_loop().run_in_executor(None, make_rooms, w, rooms)
    print(f"rooms: {rooms} rooms created in {create_s:.0f} s ({create_s / max(1, rooms - 1) * 1000:.0f} ms each, "
          f"{CREATORS} at a time)", flush=True)
    w.sets_root = w.base / "sets-rooms"
    w.sets_root.mkdir(exist_ok=True)
    for n in range(rooms):
        w.add_set(question_set(f"room{n:04d}", 1))
    store = w.base / "rooms.sqlite"
    config = w.config(store={"path": str(store)}, rooms={"default": w.room_id,
                      "sets": {f"room{n:04d}": room_id for n, room_id in enumerate(room_ids)}},
                      answerers=[w.person["user_id"], w.bot["user_id"]])
    started = time.perf_counter()
    w.start_bridge(config)
    while not store.exists():
        await asyncio.sleep(0.1)
    db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    while True:  # every question and its poll
        try:
            posted, polls = db.execute("SELECT COUNT(*), COUNT(poll_event_id) FROM posted").fetchone()
        except sqlite3.OperationalError:
            posted = polls = 0
        if posted >= rooms and polls >= rooms:
            break
        if w.bridge is None or w.bridge.poll() is not None:
            raise RuntimeError("the bridge exited during the posting; see bridge.log")
        await asyncio.sleep(0.5)
    post_s = time.perf_counter() - started
    print(f"rooms: {rooms} questions posted in {post_s:.0f} s", flush=True)
    assert w.bridge is not None
    pid = w.bridge.pid
    bare = BareClient(w.synapse.url, w.bot["user_id"], w.device_token(str(w.base / "rooms-bare-client")))
    await bare.start()
    assert bare.process is not None
    watch = FileWatch(w.sets_root, script=soak.__file__)
    await watch.start()
    await asyncio.sleep(5)  # the posting's last acknowledgements and the reference's first long poll settle
    rss = {"bridge": rss_mb(pid), "bare": rss_mb(bare.process.pid)}
    print(f"rooms: idle for {idle_s:g} s ...", flush=True)
    before = {"bridge": cpu_seconds(pid), "bare": cpu_seconds(bare.process.pid)}
    t0 = time.perf_counter()
    await asyncio.sleep(idle_s)
    window = time.perf_counter() - t0
    idle_cpu = {side: round((cpu_seconds(p) - before[side]) * 60 / window, 3)
                for side, p in (("bridge", pid), ("bare", bare.process.pid))}

    client = w.client(w.person)
    rng = random.Random(30)
    targets = rng.sample(open_questions(db), min(answers, rooms))
    sent: dict[str, float] = {}
    for question in targets:
        at = time.perf_counter()
        response = await client.room_send(question["room_id"], "m.room.message", answer(question, "b"))
        event_id = getattr(response, "event_id", None)
        if event_id is None:
            raise RuntimeError(f"the person's send failed: {response}")
        sent[event_id] = at
        deadline = time.perf_counter() + 30
        while time.perf_counter() < deadline and not (event_id in watch.seen and event_id in bare.seen):
            await asyncio.sleep(0.01)
        await asyncio.sleep(gap_s)
    await client.close()
    bridge_ms = [(watch.seen[e] - at) * 1000 for e, at in sent.items() if e in watch.seen]
    bare_ms = [(bare.seen[e] - at) * 1000 for e, at in sent.items() if e in bare.seen]
    # per answer: the bridge's durable time minus the bare client's seen time for that same answer
    paired_ms = [(watch.seen[e] - bare.seen[e]) * 1000 for e in sent if e in watch.seen and e in bare.seen]
    rss_after = rss_mb(pid)
    await watch.stop()
    await bare.stop()
    db.close()
    w.stop_bridge()
    return {
        "rooms": rooms, "create_rooms_s": round(create_s, 1), "post_s": round(post_s, 1),
        "rss_mb": rss["bridge"], "rss_after_answers_mb": rss_after, "bare_rss_mb": rss["bare"],
        "idle_s": round(window, 1), "idle_cpu_s_per_min": idle_cpu["bridge"],
        "bare_idle_cpu_s_per_min": idle_cpu["bare"],
        "answers": len(sent), "durable": len(bridge_ms), "bare_seen": len(bare_ms),
        "bridge_p50_ms": round(percentile(bridge_ms, 50), 1) if bridge_ms else None,
        "bridge_max_ms": round(max(bridge_ms), 1) if bridge_ms else None,
        "bare_p50_ms": round(percentile(bare_ms, 50), 1) if bare_ms else None,
        "bare_max_ms": round(max(bare_ms), 1) if bare_ms else None,
        "paired_p50_ms": round(percentile(paired_ms, 50), 1) if paired_ms else None,
        "paired_max_ms": round(max(paired_ms), 1) if paired_ms else None,
    }


def print_report(r: dict[str, Any]) -> None:
    print(f"{r['rooms']} rooms, one open set each (rooms created in {r['create_rooms_s']} s, posted in "
          f"{r['post_s']} s): bridge RSS {r['rss_mb']} MB (bare client {r['bare_rss_mb']} MB); CPU per idle minute "
          f"{r['idle_cpu_s_per_min']} s (bare client {r['bare_idle_cpu_s_per_min']} s); send -> durable p50 "
          f"{r['bridge_p50_ms']} max {r['bridge_max_ms']} ms over {r['durable']}/{r['answers']} answers (bare client "
          f"seen p50 {r['bare_p50_ms']} max {r['bare_max_ms']} ms; per answer, bridge minus bare p50 "
          f"{r['paired_p50_ms']:+} max {r['paired_max_ms']:+} ms)", flush=True)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with world() as w:
        return await measure(w, args.rooms, args.idle, args.answers)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bare"]:
        asyncio.run(bare_main(*sys.argv[2:5]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=60, help="seconds of the idle window (60)")
    parser.add_argument("--answers", type=int, default=10, help="answers, one at a time, in random rooms (10)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
