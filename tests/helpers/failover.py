"""Several bridge instances on one PostgreSQL store and one sets folder (one
machine, as an operator's two would share a database and a network folder),
and a storm of answers while the leader is killed and paused."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bridge.devpostgres import Postgres
from bridge.devserver import Synapse, free_port
from helpers.attack import room_history, stray_files
from helpers.auditcheck import check_answer_log
from helpers.harness import Bridge, Person, answer_content, question_posts
from helpers.netcut import Cable


@dataclass
class Cluster:
    synapse: Synapse
    postgres: Postgres
    workdir: Path
    room_id: str
    bot: dict[str, str]
    url: str = ""
    appservice: dict[str, Any] | None = None
    instances: list[Bridge] = field(default_factory=list)
    ports: dict[int, int] = field(default_factory=dict)  # id(instance) -> its /health port
    listen_ports: list[int] = field(default_factory=list)  # ports to use first (where a proxy expects them)
    cable: Cable | None = None  # the instances reach PostgreSQL through it (the test does not)

    def __post_init__(self) -> None:
        self.url = self.url or self.postgres.create_database()
        self.sets_root.mkdir(parents=True, exist_ok=True)
        self.cable = Cable(self.postgres.port)

    @property
    def bridge_url(self) -> str:
        assert self.cable is not None
        return self.url.replace(f":{self.postgres.port}/", f":{self.cable.port}/")

    @property
    def sets_root(self) -> Path:
        return self.workdir / "shared-sets"

    def add(self) -> Bridge:
        """One more instance: its own config file, log and listener, the same store and sets."""
        port = self.listen_ports[len(self.instances)] if len(self.instances) < len(self.listen_ports) else free_port()
        extra: dict[str, Any] = {
            "sets": {"root": str(self.sets_root)},
            "store": {"path": str(self.workdir / "bridge.sqlite"), "url": self.bridge_url,
                      "password": self.postgres.password},
            # One log key for every instance (beside the shared store path): a standby signs the same log.
            "audit": {"checkpoint_every": "2s"},
        }
        if self.appservice is not None:
            extra["appservice"] = {**self.appservice, "listen": f"127.0.0.1:{port}"}
        else:
            extra["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{port}"}
        instance = Bridge(synapse=self.synapse, workdir=self.workdir / f"instance{len(self.instances)}",
                          room_id=self.room_id, bot=self.bot, extra_config=extra)
        instance.workdir.mkdir(parents=True, exist_ok=True)
        self.instances.append(instance)
        self.ports[id(instance)] = port
        return instance

    def add_set(self, content: dict[str, Any]) -> Path:
        target = self.sets_root / content["id"]
        target.mkdir(parents=True, exist_ok=True)
        (target / "questions.json").write_text(json.dumps(content, indent=2))
        return target

    def answers(self, set_name: str) -> dict[str, Any]:
        path = self.sets_root / set_name / "answers.json"
        return json.loads(path.read_text()) if path.exists() else {"answers": {}}

    def health(self, instance: Bridge) -> dict[str, Any] | None:
        return http_json(f"http://127.0.0.1:{self.ports[id(instance)]}/health")

    def metrics(self, instance: Bridge) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[id(instance)]}/metrics", timeout=2) as reply:
            return reply.read().decode()

    def rows(self, sql: str, *params: Any) -> list[tuple]:
        with psycopg.connect(self.url, password=self.postgres.password) as conn:
            return conn.execute(sql, params).fetchall()

    def accepted(self) -> int:
        return self.rows("SELECT COUNT(*) FROM answer_log WHERE outcome = 'accepted'")[0][0]

    def running(self) -> list[Bridge]:
        return [i for i in self.instances if i.process and i.process.poll() is None]

    async def leader(self, timeout: float = 30, besides: Bridge | None = None, ready: bool = True) -> Bridge:
        """The instance that leads (and is ready, unless ``ready`` is False), not ``besides``."""
        deadline = time.monotonic() + timeout
        while True:
            for instance in self.running():
                if instance is besides:
                    continue
                found = self.health(instance)
                if found and found.get("role") == "leader" and (found.get("ready") or not ready):
                    return instance
            if time.monotonic() > deadline:
                logs = "\n".join(i.log_text()[-1500:] for i in self.instances)
                raise AssertionError(f"no instance leads within {timeout} s\n{self.sessions()}\n{logs}")
            await asyncio.sleep(0.1)

    def sessions(self) -> str:
        """The database's sessions and what they wait for (when no instance leads, who holds what)."""
        rows = self.rows("SELECT pid, application_name, state, wait_event_type, wait_event, xact_start,"
                         " left(query, 120) FROM pg_stat_activity WHERE datname = current_database()")
        return "\n".join(" | ".join(str(c) for c in row) for row in rows)

    async def wait_answer(self, set_name: str, qid: str, rev: int, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.answers(set_name)["answers"].get(qid)
            if record and record["rev"] >= rev:
                return record
            await asyncio.sleep(0.05)
        raise AssertionError(f"no answer rev {rev} for {qid} within {timeout} s")

    async def role_of(self, instance: Bridge, role: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (self.health(instance) or {}).get("role") != role:
            instance.check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"not {role} within {timeout} s\n{instance.log_text()[-3000:]}")
            await asyncio.sleep(0.1)

    def stop_all(self) -> None:
        for instance in self.instances:
            if instance.process and instance.process.poll() is None:
                instance.process.send_signal(signal.SIGCONT)
            instance.kill()


def http_json(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as error:
        try:
            return json.loads(error.read())
        except ValueError:
            return None
    except (urllib.error.URLError, OSError, ValueError):
        return None


# After the new leader took over from the paused one, this many answers
# are sent over this many seconds while the old one stays frozen.
FROZEN_ANSWERS = 8
FROZEN_SECONDS = 10.0


@dataclass
class FailoverStorm:
    """Three people send ``total`` answers; meanwhile the leader is killed
    ``kills`` times (restarted at once as a standby) and paused once, kept
    frozen for ``FROZEN_SECONDS`` after the standby leads while answers keep
    coming.  Times each takeover: from the leader's death to the
    first answer the next leader made durable."""

    cluster: Cluster
    people: list[Person]
    questions: dict[tuple[str, int], dict[str, Any]]
    seed: int
    total: int = 500
    kills: int = 3
    lanes: int = 3
    sent: list[tuple[str, str]] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)  # when each of ``sent`` was sent (monotonic)
    durable_at: dict[str, float] = field(default_factory=dict)  # event id -> when first seen accepted
    failures: list[float] = field(default_factory=list)  # when each kill or pause happened
    frozen: tuple[float, int] | None = None  # the leader's pause: when, and how many had been sent then
    takeovers: list[float] = field(default_factory=list)
    paused: int = 0
    extra: int = 0  # answers sent outside the storm's ``total`` (while the standby was frozen)

    async def send(self, person: Person, qid: str, text: str) -> None:
        content = answer_content(self.questions[(qid, 1)], text=text)
        event_id = await person.send(self.cluster.room_id, content)
        self.sent.append((event_id, qid))
        self.sent_at.append(time.monotonic())

    async def watch_durable(self) -> None:
        """Notes when each answer is first seen accepted, until cancelled."""
        while True:
            now = time.monotonic()
            try:
                for (event_id,) in self.cluster.rows("SELECT event_id FROM answer_log WHERE outcome = 'accepted'"):
                    self.durable_at.setdefault(event_id, now)
            except psycopg.OperationalError:
                pass  # the server restarting: look again
            await asyncio.sleep(0.2)

    async def freeze_standby_holding_the_lease(self, standby: Bridge, ttl: float) -> float:
        """SIGSTOP the standby while it holds the lease row's lock (between its
        ``SELECT ... FOR UPDATE`` and its commit).  A standby locks the row
        only to take over a lease that lapsed, so the lease is made to look
        lapsed (as when the leader's renewal comes late, the leader still
        there to renew it); this session holds the row first, so the
        standby's takeover waits behind it; the standby is stopped while it
        waits, and the row is let go, so the stopped process's session gets
        the lock and keeps it.  Meanwhile an answer is sent: it must be made
        durable, and some instance must lead, within the lease plus 5 s.
        Returns how long that answer took."""
        cluster = self.cluster
        for _attempt in range(5):
            frozen = await self._stop_inside_the_look(standby)
            if frozen is not None:
                break
            # It got through before it stopped: again, once the leader's renewal
            # put the lease right (resumed, it would take a lease that looks lapsed).
            deadline = time.monotonic() + 10
            running = "SELECT expires > clock_timestamp() FROM askwright_lease WHERE name = 'leader'"
            while not cluster.rows(running)[0][0]:
                assert time.monotonic() < deadline, "the leader did not renew its lease"
                await asyncio.sleep(0.05)
            standby.process.send_signal(signal.SIGCONT)
        else:
            raise AssertionError("the standby was never stopped holding the lease row")
        self.failures.append(frozen)
        try:
            qid = sorted({qid for qid, _rev in self.questions})[0]
            await self.send(self.people[0], qid, "while the standby is frozen")
            self.extra += 1
            while self.sent[-1][0] not in {e for (e,) in cluster.rows(
                    "SELECT event_id FROM answer_log WHERE outcome = 'accepted'")}:
                assert time.monotonic() - frozen < ttl + 5, "no answer made durable while the standby was frozen"
                await asyncio.sleep(0.05)
            took = time.monotonic() - frozen
            # Past the lease: a leader that could not renew would have stepped down by now.
            await asyncio.sleep(max(0.0, frozen + ttl + 1 - time.monotonic()))
            await cluster.leader(timeout=max(0.1, frozen + ttl + 5 - time.monotonic()))
        finally:
            standby.process.send_signal(signal.SIGCONT)
        await cluster.role_of(standby, "standby")
        return took

    async def run(self) -> None:
        rng = random.Random(self.seed)
        # Far enough apart that the sends in flight at one never reach the next.
        points = sorted(rng.sample(range(self.total // 10, self.total - self.total // 5, 30), self.kills + 1))
        pause_at = points[rng.randrange(len(points))]
        qids = sorted({qid for qid, _rev in self.questions})
        shares = [self.total // len(self.people) + (1 if i < self.total % len(self.people) else 0)
                  for i in range(len(self.people))]
        # The senders wait at each failure point until the failure happened,
        # so answers keep coming after every death, whatever the pace.
        hold = {"at": points[0]}
        go = asyncio.Event()

        async def answer(person: Person, share: int, own: random.Random) -> None:
            turns = iter(range(share))

            async def lane() -> None:
                for i in turns:
                    while len(self.sent) >= hold["at"]:
                        go.clear()
                        await go.wait()
                    await self.send(person, own.choice(qids), f"{person.user_id} says {i}")
                    await asyncio.sleep(own.uniform(0, 0.02))

            await asyncio.gather(*(lane() for _ in range(self.lanes)))

        async def fail() -> None:
            for n, point in enumerate(points):
                while len(self.sent) < point:
                    await asyncio.sleep(0.01)
                leader = await self.cluster.leader(timeout=60)
                await asyncio.sleep(rng.uniform(0, 0.3))  # inside a batch, or between two
                before = self.cluster.accepted()
                died = time.monotonic()
                self.failures.append(died)
                if point == pause_at:
                    leader.process.send_signal(signal.SIGSTOP)
                    self.frozen = (died, len(self.sent))
                    self.paused += 1
                else:
                    leader.kill()
                hold["at"] = points[n + 1] if n + 1 < len(points) else float("inf")
                go.set()
                first = asyncio.ensure_future(self._first_durable(before, died))
                if point == pause_at:
                    await self.cluster.leader(timeout=30, besides=leader, ready=False)
                    # Answers keep coming while it stays frozen (a homeserver's
                    # push in flight to it stays stuck): the new leader must find them.
                    for n in range(FROZEN_ANSWERS):
                        await self.send(self.people[n % len(self.people)], qids[n % len(qids)], f"while frozen {n}")
                        self.extra += 1
                        await asyncio.sleep(FROZEN_SECONDS / FROZEN_ANSWERS)
                    # Resumed: it finds it lost the lease and stands by.
                    leader.process.send_signal(signal.SIGCONT)
                await first
                if point != pause_at:
                    leader.start()  # comes back as a standby
                await self.cluster.role_of(leader, "standby")

        self._watcher = asyncio.ensure_future(self.watch_durable())
        await asyncio.gather(fail(), *(answer(p, share, random.Random(self.seed * 31 + n))
                                       for n, (p, share) in enumerate(zip(self.people, shares))))

    async def database_trouble(self, cut_for: float) -> tuple[float, float]:
        """The instances' network to PostgreSQL cut for ``cut_for`` seconds
        (nothing passes, nobody is told; the connections it carried stay dead),
        then PostgreSQL restarted, with answers sent all along.  Returns how
        long after each began the last answer sent meanwhile was durable."""
        cluster = self.cluster
        assert cluster.cable is not None
        qids = sorted({qid for qid, _rev in self.questions})
        figures = []
        for trouble in ("cut", "restart"):
            began = time.monotonic()
            if trouble == "cut":
                cluster.cable.sever()
                for n in range(6):  # answers keep coming while no instance can reach the store
                    await self.send(self.people[n % len(self.people)], qids[n % len(qids)], f"during the {trouble} {n}")
                    await asyncio.sleep(cut_for / 6)
                cluster.cable.mend()
            else:
                restart = asyncio.ensure_future(asyncio.to_thread(cluster.postgres.restart, 1.0))
                for n in range(6):
                    await self.send(self.people[n % len(self.people)], qids[n % len(qids)], f"during the {trouble} {n}")
                    await asyncio.sleep(0.3)
                await restart
            self.extra += 6
            mended = time.monotonic()
            last = self.sent[-1][0]
            while last not in self.durable_at:
                if time.monotonic() - mended > 60:
                    for instance in cluster.running():
                        instance.process.send_signal(signal.SIGUSR2)  # each task's awaits, into its log
                    await asyncio.sleep(1)
                    logs = "\n".join(i.log_text()[-3000:] for i in cluster.instances)
                    raise AssertionError(f"the answers sent during the {trouble} not durable 60 s after it\n{logs}")
                await asyncio.sleep(0.1)
            figures.append(self.durable_at[last] - began)
            print(f"PostgreSQL {trouble} (for {mended - began:.1f} s): the last answer sent meanwhile durable "
                  f"{figures[-1]:.2f} s after it began")
            await cluster.leader(timeout=30)
        return figures[0], figures[1]

    async def _stop_inside_the_look(self, standby: Bridge) -> float | None:
        """Stops the standby inside its look at the lease row; when it holds
        the row then, the time it was stopped, else None."""
        cluster = self.cluster
        password = cluster.postgres.password
        with psycopg.connect(cluster.url, password=password) as conn, \
                psycopg.connect(cluster.url, password=password, autocommit=True) as late:
            since = conn.execute("SELECT 1, clock_timestamp() FROM askwright_lease WHERE name = 'leader'"
                                 " FOR KEY SHARE").fetchone()[1]
            # A look that began waiting after this session held the row (not one
            # already about to give up behind a leader's transaction).
            waiting = """SELECT pid FROM pg_stat_activity WHERE datname = current_database()
                         AND wait_event_type = 'Lock' AND query LIKE '%%FOR UPDATE%%' AND query_start > %s"""
            deadline = time.monotonic() + 10
            while not (found := cluster.rows(waiting, since)):
                assert time.monotonic() < deadline, "the standby never tried to take the lease over"
                # Until the standby's look finds it lapsed (the leader's renewals
                # put it right each second; an UPDATE does not wait for this
                # session's FOR KEY SHARE).
                late.execute("UPDATE askwright_lease SET expires = clock_timestamp() - interval '1 second'"
                             " WHERE name = 'leader'")
                await asyncio.sleep(0.02)
            standby.process.send_signal(signal.SIGSTOP)
            conn.commit()
        frozen = time.monotonic()
        state = cluster.rows("SELECT state FROM pg_stat_activity WHERE pid = %s", found[0][0])
        while state == [("active",)] and time.monotonic() - frozen < 0.5:  # the server hands it the row
            await asyncio.sleep(0.01)
            state = cluster.rows("SELECT state FROM pg_stat_activity WHERE pid = %s", found[0][0])
        return frozen if state == [("idle in transaction",)] else None

    def after_freeze(self) -> list[float]:
        """For each answer sent after the leader was paused (and before the
        next failure): how long after it was sent it was durable."""
        assert self.frozen is not None
        at, first = self.frozen
        until = min([t for t in self.failures if t > at], default=float("inf"))
        return [self.durable_at[event_id] - sent for (event_id, _qid), sent
                in zip(self.sent[first:], self.sent_at[first:]) if sent < until]

    async def _first_durable(self, before: int, died: float) -> None:
        while self.cluster.accepted() <= before:
            if time.monotonic() - died > 60:
                raise AssertionError(f"no answer made durable within 60 s of the leader's death ({len(self.sent)} sent)")
            await asyncio.sleep(0.05)
        self.takeovers.append(time.monotonic() - died)

    def expected_revs(self) -> dict[str, int]:
        revs: dict[str, int] = {}
        for _event_id, qid in self.sent:
            revs[qid] = revs.get(qid, 0) + 1
        return revs

    async def settle(self, set_name: str, timeout: float = 90) -> None:
        wanted = self.expected_revs()
        deadline = time.monotonic() + timeout
        while True:
            records = self.cluster.answers(set_name)["answers"]
            if (self.cluster.accepted() >= len(self.sent)
                    and all(records.get(q, {}).get("rev") == n for q, n in wanted.items())
                    and self.cluster.rows("SELECT COUNT(*) FROM answer_log WHERE acked = 0")[0][0] == 0):
                watcher = getattr(self, "_watcher", None)
                if watcher is not None:
                    watcher.cancel()
                    now = time.monotonic()
                    for (event_id,) in self.cluster.rows("SELECT event_id FROM answer_log WHERE outcome = 'accepted'"):
                        self.durable_at.setdefault(event_id, now)
                return
            if time.monotonic() > deadline:
                logs = "\n".join(i.log_text()[-2000:] for i in self.cluster.instances)
                raise AssertionError(f"{self.cluster.accepted()} of {len(self.sent)} answers after {timeout} s\n{logs}")
            await asyncio.sleep(0.2)

    def report(self, mode: str) -> str:
        times = sorted(self.takeovers)
        return (f"failover storm ({mode} mode): {len(self.sent)} answers, {self.kills} kills, {self.paused} pause; "
                f"takeovers {', '.join(f'{t:.1f}' for t in self.takeovers)} s; "
                f"leader's death to the standby's first durable answer: p50 {statistics.median(times):.2f} s, "
                f"max {max(times):.2f} s{self._freeze_report()}")

    def _freeze_report(self) -> str:
        if self.frozen is None:
            return ""
        waits = sorted(self.after_freeze())
        return (f"; {len(waits)} answers sent after the leader was paused: sent to durable p50 "
                f"{statistics.median(waits):.2f} s, max {max(waits):.2f} s")

    async def check(self, set_name: str, question_count: int, reader: Person) -> None:
        cluster = self.cluster
        sent_ids = [event_id for event_id, _qid in self.sent]
        assert len(set(sent_ids)) == len(sent_ids) == self.total + self.extra
        rows = cluster.rows("SELECT event_id, qid, outcome FROM answer_log ORDER BY seq")
        logged = [event_id for event_id, _qid, _outcome in rows]
        assert len(logged) == len(set(logged)), "an answer was logged twice"
        accepted = [(event_id, qid) for event_id, qid, outcome in rows if outcome == "accepted"]
        assert sorted(accepted) == sorted(self.sent), "every answer sent is accepted, none twice"
        assert cluster.rows("SELECT COUNT(*) FROM dirty")[0][0] == 0
        records = cluster.answers(set_name)["answers"]
        last = {qid: event_id for event_id, qid in accepted}
        for qid, count in self.expected_revs().items():
            assert records[qid]["rev"] == count, (qid, records[qid]["rev"], count)
            assert records[qid]["source"]["event_id"] == last[qid]
        history = await room_history(reader, cluster.room_id)
        posts = question_posts(history)
        assert len(posts) == question_count, f"{len(posts)} question posts for {question_count} questions"
        # Every answer got exactly one notice.
        told: dict[str, int] = {}
        for event in history:
            replied = event.get("content", {}).get("dev.superpipeline.question.outcome", {}).get("answer_event_id")
            if replied:
                told[replied] = told.get(replied, 0) + 1
        twice = {e: n for e, n in told.items() if n > 1}
        assert twice == {}, f"notices sent twice: {list(twice.items())[:5]}"
        # Every answer was told (in its own reply, or one that stands for several: settle waited for that).
        assert cluster.rows("SELECT COUNT(*) FROM answer_log WHERE acked = 0")[0][0] == 0
        assert told, "no acknowledgement at all"
        assert stray_files(cluster.sets_root / set_name) == [], "a killed writer's temp file was left"
        checked = check_answer_log(cluster.rows, history)
        print(f"answer log: {checked} checkpoints in the room across the takeovers, all consistent with the last")
