"""Send -> durable in answers.json, beside a bare nio client seeing the same event.

One Synapse, one run: a person sends answers one at a time; a bare client
long-polls /sync and notes when each event arrives; a watcher notes when
answers.json holds it.  The difference is what the bridge adds.

Synapse wakes the long-polls waiting on a room one after another, in an
order that stays fixed for as long as each user's notifier stream lives, and
builds one response before the next: the client woken second sees every
event about 4 ms after the first.  Measured with one observer, that coin
toss (made once per run) would swing the result by +-4 ms.  So the answers
are sent in rounds, each watched by a fresh observer account (a fresh stream,
a fresh draw of the order), and the figures pool every round.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

from _world import World, answer, percentile, question_set, send, world


class FileWatch:
    """Notes when answers.json first names each event id.

    Its own process, blocked on inotify until the bridge renames a new
    answers.json into place, takes the time before anything else: a thread
    here would wait for this process's interpreter lock while the observer
    parses its sync response, at the very moment the file appears.
    ``time.perf_counter`` is the machine's monotonic clock, the same in
    every process."""

    def __init__(self, path: Path):
        self.path = path
        self.seen: dict[str, float] = {}
        self.process: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), "--watch", str(self.path),
            stdout=asyncio.subprocess.PIPE)
        assert self.process.stdout is not None
        await self.process.stdout.readline()  # "watching": the inotify watch is in place
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        async for line in self.process.stdout:
            event_id, at = line.decode().split()
            self.seen.setdefault(event_id, float(at))

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()
        if self.reader is not None:
            self.reader.cancel()


def watch_main(path: Path) -> None:
    """The watcher process: one line "<event id> <perf_counter>" per new answer."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    if fd < 0 or libc.inotify_add_watch(fd, str(path.parent).encode(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0:
        raise OSError(ctypes.get_errno(), "inotify")
    print("watching", flush=True)
    printed: set[str] = set()
    while True:
        buffer = os.read(fd, 65536)
        now = time.perf_counter()
        names, offset = set(), 0
        while offset < len(buffer):
            _wd, _mask, _cookie, length = struct.unpack_from("iIII", buffer, offset)
            names.add(buffer[offset + 16:offset + 16 + length].rstrip(b"\0"))
            offset += 16 + length
        if path.name.encode() not in names:
            continue
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        for record in doc.get("answers", {}).values():
            event_id = record["source"]["event_id"]
            if event_id not in printed:
                printed.add(event_id)
                print(event_id, now, flush=True)


IN_CLOSE_WRITE = 0x08
IN_MOVED_TO = 0x80


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


async def measure(w: World, mode: str, count: int, config_extra: dict[str, Any],
                  rounds: int | None = None) -> dict[str, Any]:
    rounds = rounds or max(1, count // 10)  # ten answers a round: many draws of the wake order
    w.sets_root = w.base / f"sets-{mode}"  # each bridge sees only its own set
    folder = w.add_set(question_set(f"lat-{mode}"))
    w.start_bridge(w.config(appservice=mode == "appservice", **config_extra))
    person = w.client(w.person)
    question = (await w.question_events(person, 1, prefix=f"lat-{mode}/"))[f"lat-{mode}/q0"]
    watch = FileWatch(folder / "answers.json")
    await watch.start()
    bridge_ms: list[float] = []
    bare_ms: list[float] = []
    per_round: list[float] = []
    sent = 0
    for n in range(rounds):
        observer = Observer(w.client(w.add_member(f"observer-{mode}-{n}")))
        observer.task = asyncio.ensure_future(observer.run())
        await asyncio.sleep(0.5)
        share = count // rounds + (n < count % rounds)
        start_of_round = len(bridge_ms)
        for _ in range(share):
            start = time.perf_counter()
            event_id = await send(person, w.room_id, answer(question, "ab"[sent % 2]))
            sent += 1
            deadline = time.monotonic() + 30
            while (event_id not in watch.seen or event_id not in observer.seen) and time.monotonic() < deadline:
                await asyncio.sleep(0.0005)
            if event_id in watch.seen and event_id in observer.seen:
                bridge_ms.append((watch.seen[event_id] - start) * 1000)
                bare_ms.append((observer.seen[event_id] - start) * 1000)
        observer.task.cancel()
        await observer.client.close()
        done = slice(start_of_round, len(bridge_ms))
        per_round.append(round(percentile(bridge_ms[done], 50) - percentile(bare_ms[done], 50), 2))
    await watch.stop()
    await person.close()
    w.stop_bridge()
    row = summary(mode, bridge_ms, bare_ms, count)
    row["overhead_p50_ms_by_round"] = per_round
    return row


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
    for r in rows:
        if r.get("overhead_p50_ms_by_round"):
            print(f"{r['mode']}: +p50 of each round (a fresh observer each): {r['overhead_p50_ms_by_round']}")
    print("(milliseconds from the person's send; target: overhead <= 5 ms at p50, <= 20 ms at p99)")


async def main(count: int, modes: list[str], rounds: int | None) -> list[dict[str, Any]]:
    rows = []
    async with world(appservice="appservice" in modes) as w:
        for mode in modes:
            rows.append(await measure(w, mode, count, {}, rounds))
    print_table(rows)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watch"]:
        watch_main(Path(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--rounds", type=int, help="rounds, each with a fresh observer (default: one per 10 answers)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--modes", nargs="+", default=["bot", "appservice"], choices=["bot", "appservice"])
    args = parser.parse_args()
    rows = asyncio.run(main(args.count, args.modes, args.rounds))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
