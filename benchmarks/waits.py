"""Agents' waits under load: 5 agents hold 500 concurrent HTTP long polls
(100 each, the default agent_api.max_waits) for a while as people answer in
the room, against the bridge as its own process on a local Synapse.

    python benchmarks/waits.py                 # 5 minutes
    python benchmarks/waits.py --minutes 1     # a shorter run

Each wait is on one question (``wait=answered&question=Q``) and, once it has
seen an answer, waits again with ``after`` = that answer's ``updated``: it
must return with the person's next answer to that question, and nothing
else.  Meanwhile an agent puts a new set every few seconds; a bare client in
the room says when its question appears.  Printed in the table style of
run_all.py: every wait's answer right, no answer missed, a new set posted
within 2 s, the bridge's threads and memory beside the same bridge before
the waits were opened.  Writes ``benchmarks/out/waits.json``."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from nio import SyncResponse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _world import World, answer, free_port, percentile, question_set, send, world  # noqa: E402
from run_all import met, render  # noqa: E402

OUT = HERE / "out"
AGENTS = 5
WAITS_PER_AGENT = 100
SETS_PER_AGENT = 10
QUESTIONS_PER_SET = WAITS_PER_AGENT // SETS_PER_AGENT
PEOPLE = 3
POST_TARGET_S = 2.0
NEW_SET_EVERY_S = 5.0
WAIT_TIMEOUT_S = 60


def token(n: int) -> str:
    return f"bench-agent-{n}-token-0123456789abcdef"


def process(pid: int) -> dict[str, float]:
    status = {line.split(":", 1)[0]: line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
              if line.startswith(("VmRSS:", "Threads:"))}
    return {"rss_mb": round(int(status["VmRSS"]) / 1024, 1), "threads": int(status["Threads"]),
            "fds": len(list(Path(f"/proc/{pid}/fd").iterdir()))}


WHOLE_TIMELINE = {"room": {"timeline": {"limit": 1000}}}


class Room:
    """A bare client in the room: when each question event reaches it."""

    def __init__(self, w: World):
        self.client = w.client(w.observer)
        self.questions: dict[str, dict[str, Any]] = {}  # "set/qid" -> the question event
        self.seen_at: dict[str, float] = {}             # set id -> when its first question arrived

    async def run(self) -> None:
        since = None
        while True:
            # Every event since the last sync, not the last ten (the default):
            # a set's questions and polls come faster than ten between two
            # syncs, and an observer whose first sync reads a busy room's
            # history long would miss some of them.
            response = await self.client.sync(timeout=1000, since=since, sync_filter=WHOLE_TIMELINE)
            now = time.perf_counter()
            if isinstance(response, SyncResponse):
                since = response.next_batch
                for room in response.rooms.join.values():
                    for event in room.timeline.events:
                        content = event.source.get("content", {})
                        if content.get("suite_event_type") == "dev.superpipeline.question.v2":
                            set_id = content["set"]["id"]
                            self.questions[f"{set_id}/{content['question']['id']}"] = event.source
                            self.seen_at.setdefault(set_id, now)


class Tally:
    def __init__(self) -> None:
        self.sent: dict[str, list[tuple[str, float]]] = {}   # "set/qid" -> [(option, when sent)]
        self.seen: dict[str, list[str]] = {}                 # "set/qid" -> options its waiter returned with
        self.right = self.wrong = self.timeouts = self.refused = self.errors = 0
        self.latency_ms: list[float] = []
        self.in_flight = 0
        self.in_flight_samples: list[int] = []
        self.stop = False


async def waiter(http: aiohttp.ClientSession, base: str, set_id: str, qid: str, tally: Tally) -> None:
    key, after = f"{set_id}/{qid}", None
    url = f"{base}/v1/sets/{set_id}/answers"
    while not tally.stop:
        params = {"wait": "answered", "question": qid, "timeout": str(WAIT_TIMEOUT_S)}
        if after is not None:
            params["after"] = after
        tally.in_flight += 1
        try:
            async with http.get(url, params=params) as response:
                body = await response.json()
                status, state = response.status, response.headers.get("Askwright-Wait")
                retry = int(response.headers.get("Retry-After", "1"))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            tally.errors += 1
            await asyncio.sleep(1)
            continue
        finally:
            tally.in_flight -= 1
        if status == 429:
            tally.refused += 1
            await asyncio.sleep(retry)
            continue
        if status != 200:
            tally.errors += 1
            await asyncio.sleep(1)
            continue
        if state != "arrived":
            tally.timeouts += 1
            continue
        now = time.perf_counter()
        entry = next(e for e in body["answers"] if e["qid"] == qid)
        sent = tally.sent.get(key, [])
        if sent and entry["choice"] == sent[-1][0] and body["set"] == set_id:
            tally.right += 1
            tally.latency_ms.append((now - sent[-1][1]) * 1000)
        else:
            tally.wrong += 1
        tally.seen.setdefault(key, []).append(entry["choice"])
        after = entry["updated"]


async def measure(w: World, minutes: float, rate: float) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    agents = {f"agent{n}": {"token": token(n)} for n in range(AGENTS)}
    config = w.config(metrics={"enabled": False, "listen": f"127.0.0.1:{port}"}, agents=agents,
                      agent_api={"rate_per_minute": 120, "max_waits": WAITS_PER_AGENT})
    people = [w.person] + [w.add_member(f"waits-person{n}") for n in range(1, PEOPLE)]
    w.start_bridge(config)
    room = Room(w)
    room_task = asyncio.ensure_future(room.run())
    tally = Tally()
    sessions = [aiohttp.ClientSession(headers={"Authorization": f"Bearer {token(n)}"},
                                      connector=aiohttp.TCPConnector(limit=0),
                                      timeout=aiohttp.ClientTimeout(total=WAIT_TIMEOUT_S + 60))
                for n in range(AGENTS)]
    clients = [w.client(p) for p in people]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                async with sessions[0].get(f"{base}/v1/sets") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline or w.bridge is None or w.bridge.poll() is not None:
                raise RuntimeError("the agents' listener did not come up; see bridge.log")
            await asyncio.sleep(0.2)
        pid = w.bridge.pid
        keys: list[tuple[int, str, str]] = []
        for n in range(AGENTS):
            for s in range(SETS_PER_AGENT):
                set_id = f"a{n}-set{s}"
                async with sessions[n].put(f"{base}/v1/sets/{set_id}",
                                           json=question_set(set_id, QUESTIONS_PER_SET)) as response:
                    assert response.status == 201, await response.text()
                keys += [(n, set_id, f"q{q}") for q in range(QUESTIONS_PER_SET)]
        total = len(keys)
        started = time.perf_counter()
        while len(room.questions) < total:
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"only {len(room.questions)} of {total} questions posted")
            await asyncio.sleep(0.5)
        print(f"waits: {total} questions posted in {time.perf_counter() - started:.0f} s; "
              f"{total} waits for {minutes:g} min ...", flush=True)
        await asyncio.sleep(2)
        before = process(pid)

        waiters = [asyncio.ensure_future(waiter(sessions[n], base, set_id, qid, tally)) for n, set_id, qid in keys]
        samples: list[dict[str, float]] = []
        posts: list[float] = []
        t0 = time.perf_counter()
        end = t0 + minutes * 60
        rng = random.Random(28)

        async def answering() -> None:
            order = [f"{set_id}/{qid}" for _n, set_id, qid in keys]
            rng.shuffle(order)
            n = 0
            await asyncio.sleep(3)  # every wait held first
            while time.perf_counter() < end - 10:  # the last answers land before the end
                key = order[n % len(order)]
                option = "ab"[(n // len(order)) % 2]  # each round of answers changes every pick
                tally.sent.setdefault(key, []).append((option, time.perf_counter()))
                await send(clients[n % PEOPLE], w.room_id, answer(room.questions[key], option))
                n += 1
                await asyncio.sleep(max(0.0, t0 + 3 + n / rate - time.perf_counter()))

        async def posting() -> None:
            made = 0
            while time.perf_counter() + NEW_SET_EVERY_S < end - 5:
                await asyncio.sleep(NEW_SET_EVERY_S)
                set_id = f"new{made}"
                made += 1
                at = time.perf_counter()
                async with sessions[made % AGENTS].put(f"{base}/v1/sets/{set_id}",
                                                      json=question_set(set_id, 1)) as response:
                    assert response.status == 201, await response.text()
                while set_id not in room.seen_at and time.perf_counter() - at < 30:
                    await asyncio.sleep(0.02)
                posts.append(room.seen_at.get(set_id, float("inf")) - at)

        async def sampling() -> None:
            while time.perf_counter() < end:
                await asyncio.sleep(5)
                samples.append(process(pid))
                tally.in_flight_samples.append(tally.in_flight)

        await asyncio.gather(answering(), posting(), sampling())
        # Every question's last answer reached its waiter?
        settle = time.perf_counter() + 30
        while time.perf_counter() < settle and any(
                tally.seen.get(k, [None])[-1] != v[-1][0] for k, v in tally.sent.items()):
            await asyncio.sleep(0.5)
        missed = sum(1 for k, v in tally.sent.items() if tally.seen.get(k, [None])[-1] != v[-1][0])
        tally.stop = True
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await asyncio.sleep(5)  # the bridge notices the long polls' clients left (it looks every 2 s)
        after = process(pid)
        alive = w.bridge is not None and w.bridge.poll() is None
    finally:
        room_task.cancel()
        for session in sessions:
            await session.close()
        for client in clients + [room.client]:
            await client.close()
        w.stop_bridge()
    held = tally.in_flight_samples[1:] or tally.in_flight_samples
    return {
        "minutes": minutes, "agents": AGENTS, "waits": total, "answers_sent": sum(len(v) for v in tally.sent.values()),
        "right": tally.right, "wrong": tally.wrong, "missed": missed, "timeouts": tally.timeouts,
        "refused_429": tally.refused, "errors": tally.errors, "held_min": min(held, default=0),
        "held_median": sorted(held)[len(held) // 2] if held else 0,
        "wait_latency_p50_ms": round(percentile(tally.latency_ms, 50), 1),
        "wait_latency_p99_ms": round(percentile(tally.latency_ms, 99), 1),
        "post_p50_s": round(percentile(posts, 50), 2), "post_max_s": round(max(posts, default=float("nan")), 2),
        "posts": len(posts), "before": before, "peak_rss_mb": max(s["rss_mb"] for s in samples),
        "peak_threads": max(s["threads"] for s in samples), "peak_fds": max(s["fds"] for s in samples),
        "after": after, "bridge_alive": alive,
    }


def table(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    b = r["before"]
    return [
        (f"{r['agents']} agents, {r['waits']} waits held for {r['minutes']:g} min (median held, min)",
         f"{r['held_median']} ({r['held_min']})", "-", f"{r['waits']}", met(r["held_min"] >= r["waits"] * 0.95)),
        (f"waits returned with the person's answer, of {r['answers_sent']:,} sent", f"{r['right']:,}",
         f"wrong {r['wrong']}, missed {r['missed']}", "all right, none missed",
         met(r["wrong"] == 0 and r["missed"] == 0 and r["right"] > 0)),
        ("... refused (429) or failed", f"{r['refused_429']} / {r['errors']}", f"timed out and waited again "
         f"{r['timeouts']}", "0 / 0", met(r["refused_429"] == 0 and r["errors"] == 0)),
        ("send -> wait returns, p50 / p99 (ms)", f"{r['wait_latency_p50_ms']} / {r['wait_latency_p99_ms']}", "-",
         "-", "-"),
        (f"a new set written -> posted in the room, p50 / max of {r['posts']} (s)",
         f"{r['post_p50_s']} / {r['post_max_s']}", "-", f"<= {POST_TARGET_S:g}",
         met(r["posts"] > 0 and r["post_max_s"] <= POST_TARGET_S)),
        ("bridge threads, peak while waiting", f"{r['peak_threads']}", f"before the waits {b['threads']}",
         "no thread per wait", met(r["peak_threads"] <= b["threads"] + 2)),
        ("bridge resident memory, peak while waiting (MB)", f"{r['peak_rss_mb']}", f"before the waits {b['rss_mb']}",
         "+<= 50", met(r["peak_rss_mb"] <= b["rss_mb"] + 50)),
        ("bridge open descriptors, peak while waiting", f"{r['peak_fds']}", f"before the waits {b['fds']}",
         f"+<= {r['waits'] + 50}", met(r["peak_fds"] <= b["fds"] + r["waits"] + 50)),
        ("... 5 s after the clients left", f"{r['after']['fds']} fds, {r['after']['threads']} threads, "
         f"{r['after']['rss_mb']} MB", "-", "-", "-"),
    ]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    async with world() as w:
        result = await measure(w, args.minutes, args.rate)
    print(render(table(result)))
    OUT.mkdir(exist_ok=True)
    (OUT / "waits.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the waits are held (default 5)")
    parser.add_argument("--rate", type=float, default=4.0, help="answers the people send per second (default 4)")
    asyncio.run(main(parser.parse_args()))
