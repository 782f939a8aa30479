"""Steady for hours: many rooms, many open questions, a steady stream of
answers, questions added and closed meanwhile; what the bridge holds over time.

    python benchmarks/soak.py [--minutes 30] [--rooms 100] [--questions 1000] [--rate 20]

One Synapse, one bridge (bot mode, as its own process).  ``--rooms`` rooms,
one set of ``--questions / --rooms`` choice questions in each; three people in
every room answer open questions picked at random, ``--rate`` answers a second
on a fixed schedule between them (each from its own client, none waits for
the last to land).  Every ``--churn`` seconds a new set of five questions is
added and five open questions are closed (their ``status`` set to closed).

Each answer is timed twice, as in ``latency.py``: until ``answers.json`` holds
it (a watcher process on inotify) and until a bare client long-polling
``/sync`` in every room sees it; the difference is what the bridge adds.
Every ``--sample`` seconds it notes the bridge's resident memory, the file
descriptors it holds (``held_descriptors``), the store's size on disk (with its WAL) and the asyncio tasks
alive in the bridge (``askwright_bridge_asyncio_tasks`` on /metrics).

Prints one line per minute and the verdict: after the first 5 minutes (the
first fifth of a shorter run) resident memory and descriptors must stay within
5% of their value then, and the p99 overhead of the last third of the minutes
no higher than 1.2x that of the first third (after the same warm-up), or
within bot mode's p99 target (``P99_FLOOR_MS``).  The store
grows with its answer log by design: its growth per thousand answers is shown.
Writes ``benchmarks/out/soak.json`` and ``soak.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import sqlite3
import statistics
import struct
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from nio import AsyncClient, SyncResponse

from _world import World, answer, free_port, percentile, question_set, world
from latency import FileWatch

OUT = Path(__file__).resolve().parent / "out"
PEOPLE = 3
# A p99 overhead within bot mode's target (+8 ms) is steady however it
# compares with the first third: 1.2x of a few ms is run-to-run noise.
P99_FLOOR_MS = 8.0
NEW_SET_QUESTIONS = 5  # a new set this big, and this many questions closed, every --churn seconds


def watch_main(root: Path) -> None:
    """Watches the sets root (for new set folders) and every set folder in it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    folders: dict[int, Path] = {}

    def add(folder: Path) -> None:
        wd = libc.inotify_add_watch(fd, str(folder).encode(), 0x08 | 0x80 | 0x100)  # CLOSE_WRITE, MOVED_TO, CREATE
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")
        folders[wd] = folder

    add(root)
    for folder in root.iterdir():
        if folder.is_dir():
            add(folder)
    print("watching", flush=True)
    printed: set[str] = set()
    while True:
        buffer = os.read(fd, 1 << 16)
        now = time.perf_counter()
        changed: set[Path] = set()
        offset = 0
        while offset < len(buffer):
            wd, mask, _cookie, length = struct.unpack_from("iIII", buffer, offset)
            name = buffer[offset + 16:offset + 16 + length].rstrip(b"\0").decode()
            offset += 16 + length
            folder = folders.get(wd)
            if folder == root and mask & 0x40000000:  # IN_ISDIR: a new set folder
                add(root / name)
            elif folder is not None and folder != root and name == "answers.json":
                changed.add(folder / name)
        for path in changed:
            try:
                doc = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            for record in doc.get("answers", {}).values():
                event_id = record["source"]["event_id"]
                if event_id not in printed:
                    printed.add(event_id)
                    print(event_id, now, flush=True)


class Observer:
    """A bare client in every room: when each event reaches it."""

    def __init__(self, client: AsyncClient):
        self.client = client
        self.seen: dict[str, float] = {}

    async def run(self) -> None:
        since = (await self.client.sync(timeout=0, sync_filter={"room": {"timeline": {"limit": 1}}})).next_batch
        while True:
            response = await self.client.sync(timeout=30000, since=since)
            now = time.perf_counter()
            if isinstance(response, SyncResponse):
                since = response.next_batch
                for room in response.rooms.join.values():
                    for event in room.timeline.events:
                        self.seen.setdefault(event.event_id, now)


def open_questions(db: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = db.execute("SELECT event_id, room_id, content FROM posted WHERE open = 1").fetchall()
    return [{"event_id": e, "room_id": r, "content": json.loads(c)} for e, r, c in rows]


async def held_descriptors(pid: int) -> int:
    """Descriptors the bridge holds: the fewer of two looks a quarter second
    apart, so the ones open for a moment (answers.json's temporary file and
    its folder while a batch is written, at 20 answers a second) are not
    counted as held; a leaked one is in both."""
    first = len(os.listdir(f"/proc/{pid}/fd"))
    await asyncio.sleep(0.25)
    return min(first, len(os.listdir(f"/proc/{pid}/fd")))


def process_figures(pid: int, store: Path, metrics_port: int, fds: int) -> dict[str, float]:
    """``fds``: counted before, as the /metrics request here is the bench's own
    connection, which the bridge closes its side of a moment after the reply."""
    # Resident memory, and its anonymous part (the heap) apart from the file-backed one (mapped libraries).
    status = {line.split(":", 1)[0]: line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
              if line.startswith(("VmRSS:", "RssAnon:", "RssFile:"))}
    rss = int(status["VmRSS"])
    size = store.stat().st_size
    wal = store.with_name(store.name + "-wal")
    wal_size = wal.stat().st_size if wal.exists() else 0
    tasks = float("nan")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith("askwright_bridge_asyncio_tasks "):
                    tasks = float(line.split()[1])
    except OSError:
        pass
    return {"rss_mb": round(rss / 1024, 2), "rss_anon_mb": round(int(status.get("RssAnon", 0)) / 1024, 2),
            "rss_file_mb": round(int(status.get("RssFile", 0)) / 1024, 2), "fds": fds,
            "store_mb": round(size / 1e6, 3), "wal_mb": round(wal_size / 1e6, 3), "tasks": tasks}


async def setup(w: World, rooms: int, questions: int, port: int) -> tuple[Path, Path, list[dict[str, str]]]:
    people, room_ids = w.rooms_with_people("soak", rooms, PEOPLE)
    per_set = max(1, questions // rooms)
    w.sets_root = w.base / "sets-soak"
    w.sets_root.mkdir(exist_ok=True)
    for n, room_id in enumerate(room_ids):
        w.add_set(question_set(f"soak{n}", per_set))
    store = w.base / "soak.sqlite"
    config = w.config(store={"path": str(store)}, rooms={"default": w.room_id,
                      "sets": {f"soak{n}": room_id for n, room_id in enumerate(room_ids)}},
                      answerers=[p["user_id"] for p in people] + [w.bot["user_id"]],
                      metrics={"enabled": True, "listen": f"127.0.0.1:{port}"})
    return config, store, people


async def measure(w: World, minutes: float, rooms: int = 100, questions: int = 1000, rate: float = 20,
                  churn: float = 30, sample: float = 10, warmup_minutes: float = 5) -> dict[str, Any]:
    port = free_port()
    config, store, people = await setup(w, rooms, questions, port)
    log = w.base / "bridge.log"
    log_from = log.stat().st_size if log.exists() else 0  # the world's log: this bridge's part is kept
    started = time.perf_counter()
    w.start_bridge(config)
    while not store.exists():
        await asyncio.sleep(0.1)
    db = sqlite3.connect(f"{store.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
    while True:  # the first posting: every question and its poll
        try:
            posted, polls = db.execute("SELECT COUNT(*), COUNT(poll_event_id) FROM posted").fetchone()
        except sqlite3.OperationalError:
            posted = polls = 0
        if posted >= questions and polls >= questions:
            break
        if w.bridge is None or w.bridge.poll() is not None:
            raise RuntimeError("the bridge exited during the posting; see bridge.log")
        await asyncio.sleep(1)
    post_s = time.perf_counter() - started
    print(f"soak: {posted} questions posted in {rooms} rooms in {post_s:.0f} s; answering for {minutes:g} min ...",
          flush=True)

    watch = FileWatch(w.sets_root, script=__file__)  # one watcher process over every set folder
    await watch.start()
    observer = Observer(w.client(w.observer))
    observer_task = asyncio.ensure_future(observer.run())
    clients = [w.client(p) for p in people]
    await asyncio.sleep(1)
    pool = open_questions(db)
    sent: dict[str, float] = {}  # event id -> send time
    closed_at: dict[str, float] = {}  # question event id -> when it was closed
    answered: dict[str, tuple[str, int]] = {}  # answer event id -> (question event id, person)
    samples: list[dict[str, Any]] = []
    errors = 0
    t0 = time.perf_counter()
    end = t0 + minutes * 60
    rng = random.Random(20)

    async def send_one(person: int, question: dict[str, Any], option: str) -> None:
        nonlocal errors
        at = time.perf_counter()
        response = await clients[person].room_send(question["room_id"], "m.room.message", answer(question, option))
        if getattr(response, "event_id", None):
            sent[response.event_id] = at
            answered[response.event_id] = (question["event_id"], person)
        else:
            errors += 1

    async def answering() -> None:
        gap = 1 / rate
        n = 0
        pending: set[asyncio.Future] = set()
        while time.perf_counter() < end:
            await asyncio.sleep(max(0.0, t0 + n * gap - time.perf_counter()))
            if pool:
                future = asyncio.ensure_future(send_one(n % PEOPLE, rng.choice(pool), "ab"[n % 2]))
                pending.add(future)
                future.add_done_callback(pending.discard)
            n += 1
        await asyncio.gather(*pending)

    async def churning() -> None:
        nonlocal pool
        added = 0
        while time.perf_counter() + churn < end:
            await asyncio.sleep(churn)
            added += 1
            w.add_set(question_set(f"soak-new{added}", NEW_SET_QUESTIONS))
            # Close a few open questions of the sets posted first, by editing their questions.json.
            victims = [q for q in pool if q["content"]["set"]["id"].startswith("soak") and
                       not q["content"]["set"]["id"].startswith("soak-new")][:NEW_SET_QUESTIONS]
            by_set: dict[str, list[str]] = {}
            for q in victims:
                by_set.setdefault(q["content"]["set"]["id"], []).append(q["content"]["question"]["id"])
                closed_at[q["event_id"]] = time.perf_counter()
            pool = [q for q in pool if q["event_id"] not in closed_at]
            for set_id, qids in by_set.items():
                path = w.sets_root / set_id / "questions.json"
                data = json.loads(path.read_text())
                for q in data["questions"]:
                    if q["id"] in qids:
                        q["status"] = "closed"
                path.write_text(json.dumps(data))

    async def sampling() -> None:
        nonlocal pool
        while time.perf_counter() < end + sample:
            assert w.bridge is not None
            figures = process_figures(w.bridge.pid, store, port, await held_descriptors(w.bridge.pid))
            figures["t_min"] = round((time.perf_counter() - t0) / 60, 3)
            samples.append(figures)
            fresh = open_questions(db)  # new sets' questions join the pool once posted
            pool = [q for q in fresh if q["event_id"] not in closed_at]
            await asyncio.sleep(sample)

    sampler = asyncio.ensure_future(sampling())
    await asyncio.gather(answering(), churning())
    await asyncio.sleep(10)  # the last answers land
    sampler.cancel()
    observer_task.cancel()
    await watch.stop()
    for client in clients + [observer.client]:
        await client.close()
    db.close()
    w.stop_bridge()
    # The bridge's own log (warnings and errors) kept beside the figures: a step
    # in a figure can be matched to what the bridge said at that minute.
    OUT.mkdir(exist_ok=True)
    with open(log, "rb") as whole:
        whole.seek(log_from)
        (OUT / "soak-bridge.log").write_bytes(whole.read())
    return summarise(minutes, rooms, questions, rate, post_s, sent, answered, closed_at, watch.seen, observer.seen,
                     samples, errors, t0, warmup_minutes)


def summarise(minutes: float, rooms: int, questions: int, rate: float, post_s: float, sent: dict[str, float],
              answered: dict[str, tuple[str, int]], closed_at: dict[str, float], durable: dict[str, float],
              seen: dict[str, float], samples: list[dict[str, Any]], errors: int, t0: float,
              warmup_minutes: float) -> dict[str, Any]:
    per_minute: dict[int, tuple[list[float], list[float]]] = {}
    lost = refused_late = replaced = 0
    # answers.json keeps each person's latest answer to a question: an answer
    # followed by the same person's next one in the same batch never shows there.
    last_sent: dict[tuple[str, int], float] = {}
    for event_id, at in sent.items():
        last_sent[answered[event_id]] = max(at, last_sent.get(answered[event_id], at))
    for event_id, at in sent.items():
        if at - t0 >= minutes * 60:
            continue  # sent in the last moment of the run: not a minute of its own
        if event_id in durable and event_id in seen:
            bridge_ms, bare_ms = (durable[event_id] - at) * 1000, (seen[event_id] - at) * 1000
            bucket = per_minute.setdefault(int((at - t0) // 60), ([], []))
            bucket[0].append(bridge_ms)
            bucket[1].append(bare_ms)
        elif closed_at.get(answered[event_id][0], float("inf")) < at + 10:
            refused_late += 1  # its question was closed about when it was sent: refused, rightly
        elif last_sent[answered[event_id]] > at:
            replaced += 1
        else:
            lost += 1
    minutes_rows = []
    for minute in sorted(per_minute):
        bridge, bare = per_minute[minute]
        minutes_rows.append({"minute": minute + 1, "answers": len(bridge),
                             "overhead_p50_ms": round(percentile(bridge, 50) - percentile(bare, 50), 2),
                             "overhead_p99_ms": round(percentile(bridge, 99) - percentile(bare, 99), 2),
                             "bridge_p50_ms": round(percentile(bridge, 50), 2),
                             "bridge_p99_ms": round(percentile(bridge, 99), 2)})
    # Warm-up: the first 5 minutes, or the first fifth of a shorter run.
    warm = min(warmup_minutes, minutes / 5)
    after = [s for s in samples if s["t_min"] >= warm] or samples[-1:]
    # A minute of samples on each side, by median: one socket open for a moment is not a leak.
    first = [s for s in after if s["t_min"] < after[0]["t_min"] + 1]
    final = [s for s in after if s["t_min"] > after[-1]["t_min"] - 1]
    base = {k: statistics.median(s[k] for s in first) for k in ("rss_mb", "fds", "tasks")}
    last = {k: statistics.median(s[k] for s in final) for k in ("rss_mb", "fds", "tasks")}
    rss_change = (last["rss_mb"] - base["rss_mb"]) / base["rss_mb"]
    fds_change = (last["fds"] - base["fds"]) / base["fds"]
    steady = [m for m in minutes_rows if m["minute"] > warm] or minutes_rows
    third = max(1, len(steady) // 3)
    p99_first = statistics.median(m["overhead_p99_ms"] for m in steady[:third])
    p99_last = statistics.median(m["overhead_p99_ms"] for m in steady[-third:])
    stored = sum(m["answers"] for m in minutes_rows)
    store_growth = ((samples[-1]["store_mb"] + samples[-1]["wal_mb"]) - (samples[0]["store_mb"] + samples[0]["wal_mb"])
                    ) * 1000 / max(1, len(sent))
    return {
        "minutes": minutes, "rooms": rooms, "questions": questions, "rate_per_s": rate, "post_s": round(post_s, 1),
        "answers_sent": len(sent), "answers_measured": stored, "send_errors": errors, "not_durable": lost,
        "replaced_in_batch": replaced,
        "refused_as_closed": refused_late, "warmup_minutes": warm, "per_minute": minutes_rows, "samples": samples,
        "rss_mb_after_warmup": round(base["rss_mb"], 2), "rss_mb_end": round(last["rss_mb"], 2),
        "rss_change": round(rss_change, 4),
        "fds_after_warmup": base["fds"], "fds_end": last["fds"], "fds_change": round(fds_change, 4),
        "tasks_after_warmup": base["tasks"], "tasks_end": last["tasks"],
        "p99_first_third_ms": round(p99_first, 2), "p99_last_third_ms": round(p99_last, 2),
        "store_mb_per_1000_answers": round(store_growth, 3),
        "memory_steady": abs(rss_change) <= 0.05, "fds_steady": abs(fds_change) <= 0.05,
        "p99_steady": p99_last <= max(1.2 * p99_first, P99_FLOOR_MS),
    }


def print_report(r: dict[str, Any]) -> None:
    print(f"{'minute':>6}{'answers':>9}{'+p50 ms':>9}{'+p99 ms':>9}{'bridge p50':>12}{'bridge p99':>12}")
    for m in r["per_minute"]:
        print(f"{m['minute']:>6}{m['answers']:>9}{m['overhead_p50_ms']:>9}{m['overhead_p99_ms']:>9}"
              f"{m['bridge_p50_ms']:>12}{m['bridge_p99_ms']:>12}")
    print(f"{'t (min)':>8}{'RSS MB':>9}{'anon':>8}{'file':>8}{'fds':>6}{'store MB':>10}{'WAL MB':>8}{'tasks':>7}")
    for s in r["samples"]:
        print(f"{s['t_min']:>8}{s['rss_mb']:>9}{s.get('rss_anon_mb', ''):>8}{s.get('rss_file_mb', ''):>8}{s['fds']:>6}"
              f"{s['store_mb']:>10}{s['wal_mb']:>8}{s['tasks']:>7}")
    yes = {True: "met", False: "NOT met"}
    print(f"{r['answers_sent']} answers sent in {r['minutes']:g} min ({r['send_errors']} send errors), "
          f"{r['answers_measured']} measured, {r['not_durable']} not durable, {r['replaced_in_batch']} replaced by the "
          f"same person's next answer within a batch, {r['refused_as_closed']} refused "
          f"as their question closed; posting {r['questions']} questions in {r['rooms']} rooms took {r['post_s']} s")
    print(f"resident memory {r['rss_mb_after_warmup']} MB after {r['warmup_minutes']:g} min, {r['rss_mb_end']} MB at "
          f"the end ({r['rss_change']:+.1%}; within 5%: {yes[r['memory_steady']]})")
    print(f"open descriptors {r['fds_after_warmup']} -> {r['fds_end']} ({r['fds_change']:+.1%}; within 5%: "
          f"{yes[r['fds_steady']]}); asyncio tasks {r['tasks_after_warmup']} -> {r['tasks_end']}")
    print(f"p99 overhead, median per minute: first third {r['p99_first_third_ms']} ms, last third "
          f"{r['p99_last_third_ms']} ms (steady, <= 1.2x or <= +{P99_FLOOR_MS:g} ms: {yes[r['p99_steady']]}); store grows "
          f"{r['store_mb_per_1000_answers']} MB per 1,000 answers (its answer log)")


def chart(r: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(8, 11), sharex=True)
    minutes = [m["minute"] - 0.5 for m in r["per_minute"]]
    axes[0].plot(minutes, [m["overhead_p50_ms"] for m in r["per_minute"]], marker="o", label="p50")
    axes[0].plot(minutes, [m["overhead_p99_ms"] for m in r["per_minute"]], marker="o", label="p99")
    axes[0].set_ylabel("overhead (ms)\nover a bare client")
    axes[0].legend(loc="upper right")
    t = [s["t_min"] for s in r["samples"]]
    for ax, key, label in zip(axes[1:], ("rss_mb", "fds", "store_mb", "tasks"),
                              ("resident memory (MB)", "open descriptors", "store on disk (MB)", "asyncio tasks")):
        ax.plot(t, [s[key] for s in r["samples"]], label="database" if key == "store_mb" else None)
        if key == "store_mb":
            ax.plot(t, [s["wal_mb"] for s in r["samples"]], label="write-ahead log")
            ax.legend(loc="upper left")
        if key == "rss_mb" and "rss_anon_mb" in r["samples"][0]:
            ax.lines[-1].set_label("all")
            ax.plot(t, [s["rss_anon_mb"] for s in r["samples"]], label="anonymous (heap)")
            ax.plot(t, [s["rss_file_mb"] for s in r["samples"]], label="file-backed")
            ax.legend(loc="upper left")
        ax.set_ylabel(label)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.axvline(r["warmup_minutes"], color="grey", linestyle=":")
    axes[-1].set_xlabel("minutes of answering")
    fig.suptitle(f"Soak: {r['rooms']} rooms, {r['questions']:,} open questions, {r['rate_per_s']:g} answers/s "
                 f"from {PEOPLE} people,\nquestions added and closed meanwhile (dotted: end of the warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with world() as w:
        return await measure(w, args.minutes, args.rooms, args.questions, args.rate, args.churn, args.sample)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watch"]:
        watch_main(Path(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30, help="minutes of answering (30)")
    parser.add_argument("--rooms", type=int, default=100)
    parser.add_argument("--questions", type=int, default=1000, help="open questions, spread over the rooms")
    parser.add_argument("--rate", type=float, default=20, help="answers per second, from three people")
    parser.add_argument("--churn", type=float, default=30, help="seconds between a set added and questions closed")
    parser.add_argument("--sample", type=float, default=10, help="seconds between samples of memory and the rest")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    print_report(result)
    OUT.mkdir(exist_ok=True)
    (OUT / "soak.json").write_text(json.dumps(result, indent=2))
    print(f"written: {OUT / 'soak.json'}, {chart(result, OUT / 'soak.png')}")
