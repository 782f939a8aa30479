"""Shared parts of the tests that attack the bridge's guarantees: an
appservice homeserver, a relay that loses its transactions, whole-room
history, a torn-file watcher, storms of answers and the figures they are
judged by."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import aiohttp
import yaml
from aiohttp import web
from nio import MessageDirection, RoomGetStateResponse, RoomMessagesResponse

from bridge.devserver import SERVER_NAME, Synapse, free_port
from helpers.auditcheck import STATE as CHECKPOINT_STATE, check_answer_log
from helpers.harness import Bridge, Person, answer_content, question_posts, store_rows
from helpers.waiting import until

AS_LOCALPART = "askbot"
AS_BOT = f"@{AS_LOCALPART}:{SERVER_NAME}"


def start_appservice_synapse(workdir: Path, preamble: str = "", beside: Sequence[str] = (),
                             **synapse_options: Any) -> Synapse:
    """A Synapse that loads the registration ``generate-registration`` wrote
    (into ``workdir``, from ``workdir/config.yaml``, which starts with
    ``preamble``), and those of the appservices ``beside`` it; its
    ``appservice`` attribute holds the bridge's appservice settings."""
    workdir.mkdir(parents=True, exist_ok=True)
    hs_port, as_port = free_port(), free_port()
    config_path = workdir / "config.yaml"
    config_path.write_text(preamble + yaml.safe_dump({
        "homeserver": {"url": f"http://127.0.0.1:{hs_port}"},
        "bot": {"user_id": AS_BOT},
        "sets": {"root": "sets"},
        "rooms": {"default": "!placeholder"},
        "store": {"path": "bridge.sqlite"},
        "appservice": {"enabled": True, "id": "askwright", "url": f"http://127.0.0.1:{as_port}",
                       "listen": f"127.0.0.1:{as_port}", "sender_localpart": AS_LOCALPART},
    }))
    registration = workdir / "registration.yaml"
    subprocess.run([sys.executable, "-m", "bridge", "generate-registration", "-c", str(config_path),
                    "-o", str(registration)], check=True, capture_output=True)
    server = Synapse(workdir / "synapse", port=hs_port, appservice_files=[str(registration), *beside],
                     **synapse_options)
    server.start()
    server.appservice = yaml.safe_load(config_path.read_text())["appservice"]
    return server


class OtherAppservice:
    """Another appservice on the same homeserver (a second bridge, say),
    interested in every room, not exclusively: it takes each transaction at
    once.  The homeserver numbers the transactions of all its appservices
    from one sequence, so beside it the bridge's ids skip."""

    def __init__(self) -> None:
        self.port = free_port()
        self.transactions = 0
        self._runner: web.AppRunner | None = None

    def registration(self, workdir: Path) -> str:
        path = workdir / "other-appservice.yaml"
        path.write_text(yaml.safe_dump({
            "id": "other", "url": f"http://127.0.0.1:{self.port}", "as_token": "other-as-token",
            "hs_token": "other-hs-token", "sender_localpart": "other_bot", "rate_limited": False,
            "namespaces": {"users": [], "aliases": [], "rooms": [{"exclusive": False, "regex": "!.*"}]},
        }))
        return str(path)

    async def _taken(self, request: web.Request) -> web.Response:
        self.transactions += request.method == "PUT"
        return web.json_response({})

    async def __aenter__(self) -> "OtherAppservice":
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._taken)  # (Synapse's ping, the old paths)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner:
            await self._runner.cleanup()


class Relay:
    """Sits where the homeserver pushes (the registration's url) and passes
    everything on to the bridge listening elsewhere, except what it is told to
    lose: transactions holding an event ``swallow`` picks, or every
    transaction while ``answer_all`` is set.  Those it answers 200 itself, so
    the homeserver counts them as delivered and never sends them again.

    While ``hold`` is set, it keeps each transaction waiting until ``hold``
    is released, then answers it 502 (counted in ``held``): the homeserver's
    push stays in flight meanwhile, as to a bridge that hangs.

    Put in front of the homeserver instead (the bridge's homeserver url), it
    answers the requests ``fail`` picks with a 502 itself, as a homeserver
    that is having trouble would."""

    def __init__(self, listen: tuple[str, int], target: str):
        self.listen = listen
        self.target = target
        self.swallow: Any = lambda event: False
        self.answer_all = False
        self.fail: Any = lambda request: False
        self.swallowed: list[str] = []  # event ids the bridge never got from the homeserver
        self.delivered: list[str] = []  # event ids in transactions the bridge answered 200 (durable there)
        self.passed = 0
        self.in_flight = 0  # requests passed on and not answered yet
        self.hold: asyncio.Event | None = None
        self.held = 0
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Relay":
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, *self.listen).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._http:
            await self._http.close()

    async def _relay(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.fail(request):
            return web.json_response({"errcode": "M_UNKNOWN", "error": "try again later"}, status=502)
        events: list[dict[str, Any]] = []
        if request.method == "PUT" and "/transactions/" in request.path:
            if self.hold is not None:
                self.held += 1
                await self.hold.wait()
                return web.json_response({"errcode": "M_UNKNOWN", "error": "held, then dropped"}, status=502)
            events = json.loads(body).get("events", [])
            if self.answer_all or any(self.swallow(event) for event in events):
                self.swallowed.extend(event["event_id"] for event in events)
                return web.json_response({})
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        self.in_flight += 1
        try:
            async with self._http.request(request.method, self.target + request.path_qs, data=body,
                                          headers=headers) as response:
                self.passed += 1
                answer = await response.read()
                if response.status == 200:
                    self.delivered.extend(event["event_id"] for event in events)
                return web.Response(status=response.status, body=answer, content_type=response.content_type)
        except aiohttp.ClientError:
            return web.json_response({"errcode": "M_UNKNOWN", "error": "the bridge is not there"}, status=502)
        finally:
            self.in_flight -= 1


async def room_history(person: Person, room_id: str) -> list[dict[str, Any]]:
    """Every event of the room, oldest first, however many pages that takes."""
    events: list[dict[str, Any]] = []
    start = ""
    while True:
        page = await person.client.room_messages(room_id, start=start, limit=1000, direction=MessageDirection.back)
        assert isinstance(page, RoomMessagesResponse), page
        events.extend(event.source for event in page.chunk)
        if not page.chunk or not page.end or page.end == start:
            break
        start = page.end
    return list(reversed(events))


def text_set(set_id: str, count: int) -> dict[str, Any]:
    """``count`` free-text questions: every answer is distinct and accepted."""
    return {
        "askwright": 1, "id": set_id, "title": "Storm",
        "questions": [{"id": f"q{n}", "kind": "text", "title": f"Question {n}",
                       "question": f"What is the word number {n}?", "why": "It is asked many times.",
                       "guess": {"text": "storm", "why": "It is the usual word.", "confidence": "high"}}
                      for n in range(count)],
    }


def appservice_storm_bridge(synapse: Synapse, workdir: Path, people: list[Person], *, invited: bool = True,
                            **room: Any) -> Bridge:
    """A room made by the first person with the others in it (``room``: more of
    createRoom's body), and an appservice bridge invited (unless not
    ``invited``), not yet started."""
    # The bridge may put state (the answer log's checkpoints), as an operator lets it.
    room.setdefault("power_level_content_override", {"users": {AS_BOT: 50}})
    bridge_invited = [AS_BOT] if invited else []
    room_id = synapse.create_room(people[0].token, invite=[*bridge_invited, *(p.user_id for p in people[1:])], **room)
    for person in people[1:]:
        synapse.join(person.token, room_id)
    bridge = Bridge(synapse=synapse, workdir=workdir, room_id=room_id, bot={"user_id": AS_BOT, "access_token": None},
                    extra_config={"appservice": dict(synapse.appservice)})
    bridge.sets_root.mkdir()
    return bridge


async def crash_storm(bridge: Bridge, people: list[Person], seed: int, *, questions: int = 10, total: int = 500,
                      settle: float = 60, quiet: Any = None) -> Storm:
    """The crash storm through ``bridge``: it is killed once while it starts and
    posts, then ``total`` answers go in while it is killed again at random;
    every guarantee is checked once all have landed.  ``quiet`` (an async
    callable) runs after the last send and before the wait for the last answer."""
    bridge.add_set(text_set("storm", questions))
    # Checkpoints often, so many are published across the kills (each checked afterwards).
    bridge.extra_config = {**bridge.extra_config, "audit": {"checkpoint_every": "2s"}}
    rng = random.Random(seed)
    bridge.start()
    # The first kill lands while the bridge is starting or posting its
    # questions: a post sent but not recorded must not be posted again.
    await asyncio.sleep(rng.uniform(0.8, 2.0))
    bridge.kill()
    bridge.start()
    posted = await bridge.wait_questions(people[0], questions, timeout=60)
    storm = Storm(bridge, people, posted, seed=seed, total=total)
    storm.kills = 1

    async def checkpoint_put() -> None:
        # Kills a few seconds apart can each land before the restarted bridge
        # signs anything; the middle kill waits for one checkpoint, so the room
        # always holds one published across the kills to check against the last.
        before = await checkpoint_size(people[0], bridge.room_id)

        async def grown() -> bool:
            return await checkpoint_size(people[0], bridge.room_id) > before

        await until(grown, timeout=60, what="a checkpoint put after a restart", every=0.2)

    storm.before_middle_kill = checkpoint_put
    began = time.monotonic()
    with TornWatch(bridge.sets_root / "storm" / "answers.json") as watch:
        await storm.run()
        storm.sent_in = time.monotonic() - began
        if quiet is not None:
            await quiet()
        await storm.settle("storm", timeout=settle)
    storm.landed_in = time.monotonic() - began
    print(f"sent in {storm.sent_in:.1f} s, all landed {storm.landed_in:.1f} s after the first send")
    # Every answer landed: a checkpoint of the whole log is published within
    # the period (the last restart's bridge may not have signed one yet, and
    # then the room held only the one from before the middle kill).
    leaves = store_rows(bridge.store_path, "SELECT COUNT(*) FROM audit_leaf")[0][0]

    async def whole_log_signed() -> bool:
        return await checkpoint_size(people[0], bridge.room_id) >= leaves

    await until(whole_log_signed, timeout=60, what=f"a checkpoint of the whole log ({leaves} leaves)", every=0.2)
    assert watch.problems == [], watch.problems[:5]
    assert watch.reads > 100
    await storm.check("storm", questions, people[0])
    checked = check_answer_log(lambda sql: store_rows(bridge.store_path, sql),
                               await room_history(people[0], bridge.room_id))
    print(f"answer log: {checked} checkpoints in the room, all consistent with the last")
    assert checked >= 2, f"{checked} checkpoint(s) in the room: none published across the kills"
    assert storm.kills >= 1 + storm.kills_wanted
    assert stray_files(bridge.sets_root / "storm") == [], "a killed writer's temp file was left"
    bridge.check_alive()
    return storm


async def checkpoint_size(person: Person, room_id: str) -> int:
    """The size of the answer log's latest checkpoint in the room's state (0: none)."""
    state = await person.client.room_get_state(room_id)
    assert isinstance(state, RoomGetStateResponse), state
    return max((e["content"].get("size", 0) for e in state.events if e.get("type") == CHECKPOINT_STATE), default=0)


def stray_files(set_dir: Path) -> list[str]:
    """What a writer killed mid-write left beside answers.json (a temp file, whatever its naming)."""
    return sorted(p.name for p in set_dir.iterdir() if p.name.startswith("answers.json."))


class TornWatch:
    """Reads a file in a loop on a thread and remembers anything that is not
    a whole JSON document, or a ``rev`` that went backwards."""

    def __init__(self, path: Path):
        self.path = path
        self.reads = 0
        self.problems: list[str] = []
        self.last_rev = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TornWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                data = None
            if data is not None:
                self.reads += 1
                try:
                    rev = json.loads(data)["rev"]
                except (ValueError, KeyError, TypeError) as exc:
                    self.problems.append(f"read {self.reads}: {exc}: {data[:80]!r}…{data[-80:]!r}")
                else:
                    if rev < self.last_rev:
                        self.problems.append(f"rev went back from {self.last_rev} to {rev}")
                    self.last_rev = rev
            time.sleep(0.001)


@dataclass
class Storm:
    """Answers from several people at once while the bridge is killed."""

    bridge: Bridge
    people: list[Person]
    questions: dict[tuple[str, int], dict[str, Any]]
    seed: int
    total: int = 500
    kills_wanted: int = 5
    pause: float = 0.0
    lanes: int = 3
    sent: list[tuple[str, str]] = field(default_factory=list)  # (event id, qid), in send order
    kills: int = 0
    sent_in: float = 0.0  # seconds from the first send to the last
    landed_in: float = 0.0  # seconds from the first send until every answer was in answers.json
    before_middle_kill: Any = None  # an async callable awaited before the middle kill

    async def run(self) -> None:
        rng = random.Random(self.seed)
        kill_points = sorted(rng.sample(range(self.total // 12, self.total - self.total // 12), self.kills_wanted))
        shares = [self.total // len(self.people) + (1 if i < self.total % len(self.people) else 0)
                  for i in range(len(self.people))]
        qids = sorted({qid for qid, _rev in self.questions})

        async def answer(person: Person, share: int, own: random.Random) -> None:
            # A few sends in flight per person, as a busy client has.
            turns = iter(range(share))

            async def lane() -> None:
                for i in turns:
                    qid = own.choice(qids)
                    content = answer_content(self.questions[(qid, 1)], text=f"{person.user_id} says {i}")
                    self.sent.append((await person.send(self.bridge.room_id, content), qid))
                    if self.pause:
                        await asyncio.sleep(own.uniform(0, 2 * self.pause))

            await asyncio.gather(*(lane() for _ in range(self.lanes)))

        async def killer() -> None:
            for n, point in enumerate(kill_points):
                while len(self.sent) < point:
                    await asyncio.sleep(0.005)
                if n == len(kill_points) // 2 and self.before_middle_kill is not None:
                    await self.before_middle_kill()
                await asyncio.sleep(rng.uniform(0, 0.3))  # somewhere inside a batch, or between two
                self.bridge.kill()
                self.kills += 1
                await asyncio.sleep(rng.uniform(0, 0.3))
                self.bridge.start()

        await asyncio.gather(killer(), *(answer(p, share, random.Random(self.seed * 31 + n))
                                         for n, (p, share) in enumerate(zip(self.people, shares))))

    def expected_revs(self) -> dict[str, int]:
        revs: dict[str, int] = {}
        for _event_id, qid in self.sent:
            revs[qid] = revs.get(qid, 0) + 1
        return revs

    async def settle(self, set_name: str, timeout: float = 60) -> None:
        """Until every answer sent is in the log and answers.json shows it."""
        wanted = self.expected_revs()
        deadline = time.monotonic() + timeout
        while True:
            self.bridge.check_alive()
            logged = store_rows(self.bridge.store_path,
                                "SELECT COUNT(*) FROM answer_log WHERE outcome='accepted'")[0][0]
            records = self.bridge.answers(set_name)["answers"]
            if logged >= len(self.sent) and all(records.get(q, {}).get("rev") == n for q, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{logged} of {len(self.sent)} answers logged after {timeout} s\n"
                                     f"{self.missing_report()}\n{self.bridge.log_text()[-3000:]}")
            await asyncio.sleep(0.2)

    def missing_report(self) -> str:
        """Each answer sent and not accepted: what the store holds of it and
        every line of the bridge's log (all its runs) that names it."""
        store = self.bridge.store_path
        accepted = {row[0] for row in store_rows(store, "SELECT event_id FROM answer_log WHERE outcome='accepted'")}
        lines = self.bridge.log_text().splitlines()
        report = []
        for n, (event_id, qid) in enumerate(self.sent, 1):
            if event_id in accepted:
                continue
            rows = {table: store_rows(store, f"SELECT * FROM {table} WHERE event_id = ?", event_id)
                    for table in ("processed", "answer_log", "undecrypted")}
            report.append(f"not accepted: {event_id} ({qid}), sent as answer {n}; "
                          f"store: {rows}")
            report.extend(f"  {line}" for line in lines if event_id in line)
        return "\n".join(report)

    async def check(self, set_name: str, question_count: int, reader: Person) -> dict[str, int]:
        """Every guarantee the storm attacks; returns its figures."""
        store = self.bridge.store_path
        sent_ids = [event_id for event_id, _qid in self.sent]
        assert len(set(sent_ids)) == len(sent_ids) == self.total
        rows = store_rows(store, "SELECT event_id, qid, outcome, ts FROM answer_log ORDER BY seq")
        logged = [event_id for event_id, _qid, _outcome, _ts in rows]
        duplicates = len(logged) - len(set(logged))
        lost = len(set(sent_ids) - set(logged))
        accepted = [(event_id, qid) for event_id, qid, outcome, _ts in rows if outcome == "accepted"]
        figures = {"answers sent": self.total, "kills": self.kills, "answers recorded": len(accepted),
                   "duplicates": duplicates, "lost": lost}
        mode = "appservice" if self.bridge.extra_config.get("appservice", {}).get("enabled") else "bot"
        print(f"crash storm ({mode} mode, seed {self.seed}): " + ", ".join(f"{k}: {v}" for k, v in figures.items()))
        assert duplicates == 0 and lost == 0
        assert sorted(accepted) == sorted(self.sent), "every answer sent is accepted, none twice"
        processed = store_rows(store, "SELECT COUNT(*) FROM processed WHERE outcome='accepted'")[0][0]
        assert processed == self.total
        # answers.json is written just before the store commits that it was: give that commit its moment.
        deadline = time.monotonic() + 15
        while store_rows(store, "SELECT COUNT(*) FROM dirty")[0][0] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert store_rows(store, "SELECT COUNT(*) FROM dirty")[0][0] == 0

        records = self.bridge.answers(set_name)["answers"]
        # The answer that stands is the latest by origin_server_ts, arrival breaking
        # ties; an answer held for decryption is accepted after later ones but stands before them.
        latest: dict[str, tuple[int, int, str]] = {}
        for seq, (event_id, qid, outcome, ts) in enumerate(rows):
            if outcome == "accepted":
                latest[qid] = max(latest.get(qid, (ts, seq, event_id)), (ts, seq, event_id))
        last = {qid: event_id for qid, (_ts, _seq, event_id) in latest.items()}
        for qid, count in self.expected_revs().items():
            assert records[qid]["rev"] == count, (qid, records[qid]["rev"], count)
            assert records[qid]["source"]["event_id"] == last[qid]

        posts = question_posts(await room_history(reader, self.bridge.room_id))
        assert len(posts) == question_count, f"{len(posts)} question posts for {question_count} questions"
        assert len({p["content"]["question"]["id"] for p in posts}) == question_count
        assert self.kills >= self.kills_wanted
        return figures
