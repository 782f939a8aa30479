"""Send -> durable in answers.json, beside a bare nio client seeing the same event.

One Synapse, one run: a person sends answers one at a time; a bare client
long-polls /sync and notes when each event arrives; a watcher notes when
answers.json holds it.  The difference is what the bridge adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from _world import World, answer, percentile, question_set, send, world


class FileWatch(threading.Thread):
    """Notes when answers.json first names each event id (polls its mtime every 0.5 ms)."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            try:
                stamp = os.stat(self.path).st_mtime_ns
            except FileNotFoundError:
                stamp = None
            if stamp is not None and stamp != last:
                now = time.perf_counter()
                last = stamp
                try:
                    doc = json.loads(self.path.read_bytes())
                except (OSError, ValueError):
                    continue
                for record in doc.get("answers", {}).values():
                    self.seen.setdefault(record["source"]["event_id"], now)
            time.sleep(0.0005)


class Observer:
    """A bare matrix-nio client: the reference for 'the homeserver delivered it'."""

    def __init__(self, client: Any):
        self.client = client
        self.seen: dict[str, float] = {}
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        since = (await self.client.sync(timeout=0)).next_batch
        while True:
            response = await self.client.sync(timeout=30000, since=since)
            now = time.perf_counter()
            since = response.next_batch
            for room in response.rooms.join.values():
                for event in room.timeline.events:
                    self.seen.setdefault(event.event_id, now)


async def measure(w: World, mode: str, count: int, config_extra: dict[str, Any]) -> dict[str, Any]:
    w.sets_root = w.base / f"sets-{mode}"  # each bridge sees only its own set
    folder = w.add_set(question_set(f"lat-{mode}"))
    w.start_bridge(w.config(appservice=mode == "appservice", **config_extra))
    person = w.client(w.person)
    observer = Observer(w.client(w.observer))
    question = (await w.question_events(person, 1, prefix=f"lat-{mode}/"))[f"lat-{mode}/q0"]
    watch = FileWatch(folder / "answers.json")
    watch.start()
    observer.task = asyncio.ensure_future(observer.run())
    await asyncio.sleep(1)
    bridge_ms, bare_ms = [], []
    for n in range(count):
        start = time.perf_counter()
        event_id = await send(person, w.room_id, answer(question, "ab"[n % 2]))
        deadline = time.monotonic() + 30
        while (event_id not in watch.seen or event_id not in observer.seen) and time.monotonic() < deadline:
            await asyncio.sleep(0.0005)
        if event_id in watch.seen and event_id in observer.seen:
            bridge_ms.append((watch.seen[event_id] - start) * 1000)
            bare_ms.append((observer.seen[event_id] - start) * 1000)
    watch.stop.set()
    observer.task.cancel()
    await person.close()
    await observer.client.close()
    w.stop_bridge()
    return summary(mode, bridge_ms, bare_ms, count)


def summary(mode: str, bridge_ms: list[float], bare_ms: list[float], count: int) -> dict[str, Any]:
    row: dict[str, Any] = {"mode": mode, "answers": count, "measured": len(bridge_ms)}
    for p in (50, 99):
        row[f"bridge_p{p}_ms"] = round(percentile(bridge_ms, p), 2)
        row[f"bare_p{p}_ms"] = round(percentile(bare_ms, p), 2)
        row[f"overhead_p{p}_ms"] = round(percentile(bridge_ms, p) - percentile(bare_ms, p), 2)
    # Per answer: what the bridge added to what the homeserver took.
    overhead = [b - r for b, r in zip(bridge_ms, bare_ms)]
    row["overhead_of_each_p50_ms"] = round(percentile(overhead, 50), 2)
    row["overhead_of_each_p99_ms"] = round(percentile(overhead, 99), 2)
    row["samples"] = {"bridge_ms": [round(v, 3) for v in bridge_ms], "bare_ms": [round(v, 3) for v in bare_ms]}
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'mode':<12}{'n':>6}{'bridge p50':>12}{'bare p50':>10}{'+p50':>8}{'bridge p99':>12}{'bare p99':>10}{'+p99':>8}")
    for r in rows:
        print(f"{r['mode']:<12}{r['measured']:>6}{r['bridge_p50_ms']:>12}{r['bare_p50_ms']:>10}{r['overhead_p50_ms']:>8}"
              f"{r['bridge_p99_ms']:>12}{r['bare_p99_ms']:>10}{r['overhead_p99_ms']:>8}")
    print("(milliseconds from the person's send; target: overhead <= 5 ms at p50, <= 20 ms at p99)")


async def main(count: int, modes: list[str]) -> list[dict[str, Any]]:
    rows = []
    async with world(appservice="appservice" in modes) as w:
        for mode in modes:
            rows.append(await measure(w, mode, count, {}))
    print_table(rows)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--modes", nargs="+", default=["bot", "appservice"], choices=["bot", "appservice"])
    args = parser.parse_args()
    rows = asyncio.run(main(args.count, args.modes))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
