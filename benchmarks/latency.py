"""Send -> durable in answers.json, beside a bare client seeing the same event.

One Synapse, one run: a person sends answers; a watcher notes when
answers.json holds each.  The reference notes when the homeserver delivered
it: in bot mode a bare nio client long-polling /sync, in appservice mode a
bare appservice registered beside the bridge's (``_receiver.py``: it answers
each transaction at once and does nothing else).  The difference is what the
bridge adds.

Synapse wakes the long-polls waiting on a room one after another, in an
order that stays fixed for as long as each user's notifier stream lives, and
builds one response before the next: the client woken second sees every
event about 4 ms after the first.  Measured with one observer, that coin
toss (made once per run) would swing the result by +-4 ms.  So the answers
are sent in rounds of five, each watched by a fresh observer account (a fresh
stream, a fresh draw of the order), and the figures pool every round: the
more draws, the nearer the pooled figure comes to what the bridge adds on
average.  In a plain room each observer leaves after its round: a member
costs the homeserver work on every message, and a room that grew by one
member a round would slow every later round (in an encrypted room a leave
makes every client start a new room key, so there they stay).

By default it measures the harder case (``HARD``), as a deployment sees it:
the bridge installed from a plain wheel, ``answerers`` configured, the
eight-question example set (every kind, polls, a video with captions)
answered in every way (options, free text, an approval's binding, poll
votes), one answer every 50 ms on a fixed schedule whether or not the last
one is through, and a fresh answers.json watcher each round.  ``--easy``
is the earlier case (one choice question from the source tree, the next
answer once the last is seen); ``--vary`` changes one condition at a time.
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import _sync_timing
from _world import AS_LOCALPART, ROOT, World, answer, percentile, question_set, world

from bridge.devserver import SERVER_NAME

from bridge.protocol.poll import POLL_KEY, POLL_START
from bridge.protocol.render import SINGLE_PICK_KINDS

EXAMPLE = "release-decisions"  # eight questions: every kind, polls, a video with captions


@dataclass(frozen=True)
class Conditions:
    mixed: bool = True  # the eight-question example, answered in every way; else one choice question
    answerers: bool = True  # ``answerers`` configured (the person); else every room member may answer
    gap_ms: float = 50  # one answer this often on a fixed schedule; 0: the next once the last is seen
    wheel: bool = True  # the bridge from a plain wheel; else from the source tree
    watcher_per_round: bool = True  # a fresh answers.json watcher each round; else one for the run
    encrypted: bool = False  # an end-to-end encrypted room: the person's client encrypts, the bridge decrypts

    def label(self) -> str:
        if self.encrypted:
            return replace(self, encrypted=False).label() + "+e2e"
        changed = [f"{k}={v}" for k, v in asdict(self).items() if v != getattr(HARD, k)]
        return "hard" if not changed else ("easy" if self == EASY else ",".join(changed))


HARD = Conditions()
PROFILE = ""  # --profile: the bridge under cProfile, its stats written to "<PROFILE>-<set>.prof"
STAGES = ""  # --stages: each batch's stages (``_stages.py``) written to "<STAGES>-<set>.jsonl"
EASY = Conditions(mixed=False, answerers=False, gap_ms=0, wheel=False, watcher_per_round=False)


class LineProcess:
    """A helper process that prints one line when it is ready, then
    "EVENT_ID TIME" each time it first sees an event: ``seen`` keeps the first
    time of each."""

    def __init__(self, argv: list[str]):
        self.argv = argv
        self.seen: dict[str, float] = {}
        self.process: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(*self.argv, stdout=asyncio.subprocess.PIPE)
        assert self.process.stdout is not None
        await self.process.stdout.readline()  # its "ready" line
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


class FileWatch(LineProcess):
    """Notes when answers.json first names each event id.

    Its own process, blocked on inotify until the bridge renames a new
    answers.json into place, takes the time before anything else: a thread
    here would wait for this process's interpreter lock while the observer
    parses its sync response, at the very moment the file appears.
    ``time.perf_counter`` is the machine's monotonic clock, the same in
    every process."""

    def __init__(self, path: Path, script: str = __file__):
        # ``script``'s "--watch PATH" runs the watcher (soak.py watches every
        # set folder); it prints "watching" once the inotify watch is in place.
        super().__init__([sys.executable, str(Path(script).resolve()), "--watch", str(path)])
        self.path = path


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


class Answers:
    """The answers a person sends in turn: to the one choice question, or to
    each of the example's questions the way its kind is answered (an option,
    free text, a whole order, an approval with its binding, a reply naming
    options by number) and, for those with a poll, a vote in the poll every
    other time."""

    def __init__(self, questions: dict[str, dict], polls: dict[str, str]):
        self.questions = sorted(questions.values(), key=lambda e: e["event_id"])
        self.polls = polls  # question event id -> poll event id
        self.turn = 0

    def next(self) -> tuple[str, dict[str, Any]]:
        typed = self._next()
        self.last = typed
        return typed

    def _next(self) -> tuple[str, dict[str, Any]]:
        n = self.turn
        self.turn += 1
        event = self.questions[n % len(self.questions)]
        q = event["content"]["question"]
        options = [o["id"] for o in q.get("options", []) if o["id"] not in ("unsure", "other")]
        pick = options[(n // len(self.questions)) % len(options)] if options else None
        poll = self.polls.get(event["event_id"])
        if poll and pick and (n // len(self.questions)) % 2:
            return "org.matrix.msc3381.poll.response", {
                "org.matrix.msc3381.poll.response": {"answers": [pick]},
                "m.relates_to": {"rel_type": "m.reference", "event_id": poll}}
        if q["kind"] == "multi":  # as Element sends it: a reply naming options by number
            body = ["1, 3", "2"][(n // len(self.questions)) % 2]
            return "m.room.message", {"msgtype": "m.text", "body": body,
                                      "m.relates_to": {"m.in_reply_to": {"event_id": event["event_id"]}}}
        if q["kind"] == "rank" or pick is None:  # the whole order, or free text
            turn = (n // len(self.questions)) % max(1, len(options))
            content = answer(event, "x")
            del content["option_id"]
            content["text"] = content["body"] = (", ".join(options[turn:] + options[:turn]) if options
                                                 else f"Headline number {n}")
            return "m.room.message", content
        content = answer(event, pick)
        if event["content"].get("subject"):
            content["subject"] = dict(event["content"]["subject"])
        return "m.room.message", content


async def posted(w: World, client: Any, set_id: str, questions: int, polls: int,
                 timeout: float = 300) -> tuple[dict[str, dict], dict[str, str]]:
    """The set's question events and its polls, once all are posted."""
    from nio import SyncResponse

    found: dict[str, dict] = {}
    poll_of: dict[str, str] = {}
    since = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = await client.sync(timeout=1000, since=since,
                                     sync_filter={"room": {"timeline": {"limit": 1000}}})
        if isinstance(response, SyncResponse):
            since = response.next_batch
            await key_chores(client)  # an encrypting client reads the questions once it has their keys
            for room in response.rooms.join.values():
                for event in room.timeline.events:
                    content = event.source.get("content", {})
                    if (content.get("suite_event_type") == "dev.superpipeline.question.v2"
                            and content["set"]["id"] == set_id):
                        found[content["question"]["id"]] = event.source
                    if event.source.get("type") == POLL_START and POLL_KEY in content:
                        poll_of[content[POLL_KEY]["question_event_id"]] = event.event_id
        mine = {found[q]["event_id"] for q in found}
        if len(found) >= questions and len(mine & poll_of.keys()) >= polls:
            return found, {k: v for k, v in poll_of.items() if k in mine}
    log = (w.base / "bridge.log").read_text(errors="replace")[-3000:]
    raise TimeoutError(f"{len(found)} of {questions} questions and {len(poll_of)} of {polls} polls were posted; "
                       f"the bridge's log ends:\n{log}")


async def measure(w: World, mode: str, count: int, config_extra: dict[str, Any],
                  rounds: int | None = None, conditions: Conditions = HARD, code: str | None = None,
                  tag: str = "") -> dict[str, Any]:
    """``code``: the bridge of that git commit (a wheel of it) instead of the
    source tree's; ``tag``: a suffix for the set's id (one set per measurement)."""
    rounds = rounds or max(1, count // 5)  # five answers a round: many draws of the wake order
    label = conditions.label()
    set_id = f"lat-{mode}-{label}{tag}".replace(",", "-").replace("=", "-").replace(".", "").replace("+", "-")
    w.sets_root = w.base / f"sets-{set_id}"  # each bridge sees only its own set
    w.sets_root.mkdir(exist_ok=True)
    if conditions.mixed:
        folder = w.add_example(EXAMPLE, set_id)
        kinds = [q["kind"] for q in json.loads((folder / "questions.json").read_text())["questions"]]
    else:
        folder = w.add_set(question_set(set_id))
        kinds = ["choice"]
    extra = dict(config_extra)
    room_id, account, person = w.room_id, w.person, w.client(w.person)
    if conditions.encrypted:
        room_id, account, person = await encrypted_room(w, mode, set_id)
        extra["rooms"] = {"default": room_id}
    if conditions.answerers:
        # The room's creator too: it invited the appservice user, and an
        # appservice bridge answers that invite (replayed to it at start) by
        # leaving when the inviter may not answer.
        extra["answerers"] = [account["user_id"], w.bot["user_id"]]
    store = {"path": str(w.base / f"{set_id}.sqlite")}
    trace = w.base / f"{set_id}.trace"  # when the bridge's syncs return, or its transactions arrive
    if PROFILE:
        os.environ["ASKWRIGHT_BENCH_PROFILE"] = f"{PROFILE}-{set_id}.prof"  # read by ``_traced.py``
    stages = Path(f"{STAGES}-{set_id}.jsonl") if STAGES else None
    if stages is not None:
        stages.unlink(missing_ok=True)
        os.environ["ASKWRIGHT_BENCH_STAGES"] = str(stages)  # read by ``_traced.py``
    w.start_bridge(w.config(appservice=mode == "appservice", store=store, **extra),
                   site=w.wheel_site(code) if conditions.wheel or code else None, trace=trace)
    questions, polls = await posted(w, person, set_id, len(kinds), sum(kind in SINGLE_PICK_KINDS for kind in kinds))
    answers = Answers(questions, polls)
    await key_chores(person)  # an encrypting client: the bridge's device known before the first answer
    watch = FileWatch(folder / "answers.json")
    if not conditions.watcher_per_round:
        await watch.start()
    bridge_ms: list[float] = []
    bare_ms: list[float] = []
    received_ms: list[float] = []  # the bridge's sync response or transaction, as the observer's
    # The reference: in bot mode the bare /sync client (a fresh one each
    # round), in appservice mode the bare appservice beside the bridge's.
    receiver = w.receiver if mode == "appservice" else None
    sync_ms: list[float] = []  # appservice mode: the bare /sync client too, beside the bare appservice
    per_round: list[float] = []
    round_sizes: list[int] = []
    timed: list[tuple[float, float, float, str]] = []  # for the homeserver's side (``_sync_timing``)
    lost = 0
    assert w.bridge is not None and w.synapse.process is not None
    cpu_before = cpu_seconds(w.bridge.pid), cpu_seconds(w.synapse.process.pid)
    for n in range(rounds):
        observer_account = w.add_member(f"observer-{set_id}-{n}", room_id)
        observer = Observer(w.client(observer_account))
        observer.task = asyncio.ensure_future(observer.run())
        if conditions.watcher_per_round:
            watch = FileWatch(folder / "answers.json")
            await watch.start()
        await asyncio.sleep(0.5)
        await key_chores(person)
        share = count // rounds + (n < count % rounds)
        sent: dict[str, float] = {}
        if conditions.gap_ms:
            await send_on_schedule(person, room_id, answers, share, conditions.gap_ms / 1000, sent)
        else:
            for _ in range(share):
                await send_one(person, room_id, answers.next(), sent)
                await seen_by_both(sent, watch, observer.seen, *([receiver.seen] if receiver else []))
        complete = await seen_by_both(sent, watch, observer.seen, *([receiver.seen] if receiver else []))
        lost += len(sent) - len(complete)
        start_of_round = len(bridge_ms)
        received = read_trace(trace)
        for event_id in complete:
            bridge_ms.append((watch.seen[event_id] - sent[event_id]) * 1000)
            bare_ms.append(((receiver or observer).seen[event_id] - sent[event_id]) * 1000)
            if receiver is not None:
                sync_ms.append((observer.seen[event_id] - sent[event_id]) * 1000)
            if event_id in received:
                received_ms.append((received[event_id] - sent[event_id]) * 1000)
                timed.append((sent[event_id], received[event_id], observer.seen[event_id], observer_account["user_id"]))
        observer.task.cancel()
        if not conditions.encrypted:
            await observer.client.room_leave(room_id)
        await observer.client.close()
        if conditions.watcher_per_round:
            await watch.stop()
        done = slice(start_of_round, len(bridge_ms))
        round_sizes.append(len(bridge_ms) - start_of_round)
        if bridge_ms[done]:
            # The round's median of the per-answer differences: one draw of the wake order.
            per_round.append(round(percentile([b - r for b, r in zip(bridge_ms[done], bare_ms[done])], 50), 2))
    cpu = [(after - before) * 1000 / max(1, len(bridge_ms)) for before, after in
           zip(cpu_before, (cpu_seconds(w.bridge.pid), cpu_seconds(w.synapse.process.pid)))]
    await watch.stop()
    await person.close()
    w.stop_bridge()
    row = summary(mode, bridge_ms, bare_ms, count)
    row["samples"]["round_sizes"] = round_sizes  # the answers of each round, in order
    row["reference"] = "bare transaction receiver" if receiver is not None else "bare /sync client"
    if sync_ms:
        row["bare_sync_p50_ms"] = round(percentile(sync_ms, 50), 2)
        row["overhead_over_sync_p50_ms"] = round(percentile(bridge_ms, 50) - percentile(sync_ms, 50), 2)
    # CPU time per answer (of the whole run, acknowledgements included): unlike
    # the wall-clock figures it hardly moves with other work on the machine.
    row["bridge_cpu_ms_per_answer"], row["synapse_cpu_ms_per_answer"] = (round(v, 2) for v in cpu)
    row["conditions"] = asdict(conditions) | {"label": label + (f"@{code}" if code else "")}
    row["not_seen_in_answers_json"] = lost
    if received_ms and len(received_ms) == len(bridge_ms):
        # What the overhead is made of: the homeserver answering the bridge's
        # sync later than the observer's, and the bridge's own work after it.
        delivery = [r - b for r, b in zip(received_ms, bare_ms)]
        own = [d - r for d, r in zip(bridge_ms, received_ms)]
        row["bridge_received_p50_ms"] = round(percentile(received_ms, 50), 2)
        row["delivery_p50_ms"], row["delivery_p99_ms"] = (round(percentile(delivery, p), 2) for p in (50, 99))
        row["own_p50_ms"], row["own_p99_ms"] = (round(percentile(own, p), 2) for p in (50, 99))
        row["samples"]["own_ms"] = [round(v, 3) for v in own]
    access_log = w.synapse.data_dir / "access.log"
    if mode == "bot" and access_log.exists():
        row["homeserver_side"] = _sync_timing.explain(timed, w.bot["user_id"], _sync_timing.sync_requests(access_log))
    row["paired_by_round_ms"] = per_round
    if stages is not None and stages.exists():
        row["stages_ms"] = stage_summary(stages)
    if per_round:
        row["paired_round_median_ms"] = round(percentile(per_round, 50), 2)
        row["paired_round_max_ms"] = max(per_round)
    return row


STAGE_ORDER = ["arrived", "headers", "parsed", "received", "synced", "handle", "feeding", "preparing",
               "prepared", "job", "judged", "update", "writing", "tempsynced", "replaced", "committed", "jobdone",
               "handled"]
# Bot mode's next long poll is asked on the event loop while the store's
# thread makes the COMMIT (``nextpoll``): its steps run beside the chain's last ones.
BESIDE = [("committed", "ahead"), ("ahead", "asked")]


def stage_summary(path: Path) -> dict[str, list[float]]:
    """--stages: p50 and p99 (ms) of each step of a batch, from one stage to the
    next (``_stages.py``), over the batches that wrote answers.json."""
    steps: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        batch = json.loads(line)
        stages = batch["stages"]
        if "replaced" not in stages:
            continue
        if "synced" in stages:
            # The batch before still being made durable when this one's response was in.
            steps.setdefault("queued behind the batch before", []).append(
                max(0.0, batch.get("before", 0.0) - stages["synced"]) * 1000)
        present = [name for name in STAGE_ORDER if name in stages]
        for a, b in [*zip(present, present[1:]), *BESIDE]:
            if a in stages and b in stages:
                steps.setdefault(f"{a}->{b}", []).append((stages[b] - stages[a]) * 1000)
        if "synced" in stages:
            steps.setdefault("synced->replaced", []).append((stages["replaced"] - stages["synced"]) * 1000)
        if "headers" in stages:
            steps.setdefault("headers->replaced", []).append((stages["replaced"] - stages["headers"]) * 1000)
    return {step: [round(percentile(v, 50), 3), round(percentile(v, 99), 3), len(v)] for step, v in steps.items()}


def read_trace(path: Path | None) -> dict[str, float]:
    """event id -> when a sync response holding it reached the bridge (``_traced.py``)."""
    found: dict[str, float] = {}
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            event_id, _, at = line.partition(" ")
            found.setdefault(event_id, float(at))
    return found


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def send_one(client: Any, room_id: str, typed: tuple[str, dict[str, Any]], sent: dict[str, float]) -> None:
    event_type, content = typed
    start = time.perf_counter()
    response = await client.room_send(room_id, event_type, content, ignore_unverified_devices=True)
    sent[response.event_id] = start


async def encrypted_room(w: World, mode: str, name: str) -> tuple[str, dict[str, str], Any]:
    """A room with encryption on, and a person in it whose client encrypts,
    cross-signed as a current client is (the bridge's default trust asks for
    it).  The observers stay bare clients: they note when the encrypted event
    arrives, without decrypting it, so the reference is if anything early."""
    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.e2e import ENCRYPTION_STATE, EncryptingPerson

    account = w.synapse.register(f"person-{name}")
    invite = [account["user_id"]] + ([f"@{AS_LOCALPART}:{SERVER_NAME}"] if mode == "appservice" else [])
    room_id = w.synapse.create_room(w.bot["access_token"], invite=invite, initial_state=[ENCRYPTION_STATE])
    w.synapse.join(account["access_token"], room_id)
    person = EncryptingPerson(w.synapse, account, w.base / f"{name}-keys")
    await person.cross_sign()
    return room_id, account, person.client


async def key_chores(client: Any) -> None:
    """What nio's sync_forever does for an encrypting client between syncs; nothing for a plain one."""
    if client.olm is None:
        return
    if client.should_upload_keys:
        await client.keys_upload()
    if client.should_query_keys:
        await client.keys_query()
    if client.should_claim_keys:
        await client.keys_claim(client.get_users_for_key_claiming())
    await client.send_to_device_messages()


async def send_on_schedule(client: Any, room_id: str, answers: Answers, count: int, gap: float,
                           sent: dict[str, float]) -> None:
    """``count`` answers, one every ``gap`` seconds whether or not the last is through."""
    first = time.perf_counter()
    sends = []
    for k in range(count):
        await asyncio.sleep(max(0.0, first + k * gap - time.perf_counter()))
        sends.append(asyncio.ensure_future(send_one(client, room_id, answers.next(), sent)))
    await asyncio.gather(*sends)


async def seen_by_both(sent: dict[str, float], watch: FileWatch, *references: dict[str, float],
                       timeout: float = 30) -> list[str]:
    """The event ids the watcher and every reference have seen, once all are (or at the timeout)."""
    seen = [watch.seen, *references]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(e in s for e in sent for s in seen):
            break
        await asyncio.sleep(0.0005)
    return [e for e in sent if all(e in s for s in seen)]


def summary(mode: str, bridge_ms: list[float], bare_ms: list[float], count: int) -> dict[str, Any]:
    """The figures of one mode.  The headline is per answer, paired: for
    each answer, the time it was durable minus the time the reference saw
    that same answer, then the percentiles of those differences: what a
    person waits beyond what their own client would have shown them.  The
    difference of the two pooled distributions' percentiles (``pooled_*``)
    is kept beside it: it can hide a lag nearly every answer has (a few
    answers the bridge got early shift the pooled p50 by as much)."""
    row: dict[str, Any] = {"mode": mode, "answers": count, "measured": len(bridge_ms)}
    for p in (50, 99):
        row[f"bridge_p{p}_ms"] = round(percentile(bridge_ms, p), 2)
        row[f"bare_p{p}_ms"] = round(percentile(bare_ms, p), 2)
        row[f"pooled_p{p}_ms"] = round(percentile(bridge_ms, p) - percentile(bare_ms, p), 2)
    paired = [b - r for b, r in zip(bridge_ms, bare_ms)]
    row["paired_p50_ms"] = round(percentile(paired, 50), 2)
    row["paired_p99_ms"] = round(percentile(paired, 99), 2)
    row["samples"] = {"bridge_ms": [round(v, 3) for v in bridge_ms], "bare_ms": [round(v, 3) for v in bare_ms]}
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'mode':<12}{'conditions':<28}{'n':>6}{'per answer +p50':>17}{'+p99':>8}{'rounds +p50':>13}"
          f"{'pooled +p50':>13}{'bridge p50':>12}{'bare p50':>10}{'bridge cpu':>12}{'hs cpu':>12}")
    for r in rows:
        print(f"{r['mode']:<12}{r.get('conditions', {}).get('label', ''):<28}{r['measured']:>6}"
              f"{r['paired_p50_ms']:>17}{r['paired_p99_ms']:>8}{r.get('paired_round_median_ms', ''):>13}"
              f"{r['pooled_p50_ms']:>13}{r['bridge_p50_ms']:>12}{r['bare_p50_ms']:>10}"
              f"{r.get('bridge_cpu_ms_per_answer', ''):>12}{r.get('synapse_cpu_ms_per_answer', ''):>12}")
    for r in rows:
        if "bare_sync_p50_ms" in r:
            print(f"{r['mode']} {r['conditions']['label']}: the reference is a bare appservice beside the bridge's; "
                  f"a bare /sync client saw the same answers at p50 {r['bare_sync_p50_ms']} ms "
                  f"(the bridge +{r['overhead_over_sync_p50_ms']} ms over it)")
        if "own_p50_ms" in r:
            print(f"{r['mode']} {r['conditions']['label']}: of the overhead, the homeserver delivering to the bridge "
                  f"later (its sync answered, its transaction pushed): p50 {r['delivery_p50_ms']} ms, p99 {r['delivery_p99_ms']} ms; the bridge's own work after "
                  f"it: p50 {r['own_p50_ms']} ms, p99 {r['own_p99_ms']} ms")
        if "homeserver_side" in r:
            _sync_timing.print_explanation(r["mode"], r["conditions"]["label"], r["homeserver_side"])
        for step, (p50, p99, n) in r.get("stages_ms", {}).items():
            print(f"{r['mode']} {r['conditions']['label']}: stage {step:<22} p50 {p50:>7} ms  p99 {p99:>7} ms  ({n} batches)")
        if r.get("not_seen_in_answers_json"):
            print(f"{r['mode']} {r['conditions']['label']}: {r['not_seen_in_answers_json']} answers never seen in "
                  "answers.json (replaced by the next answer to the question within the same batch)")
    for r in rows:
        if r.get("paired_by_round_ms"):
            print(f"{r['mode']} {r.get('conditions', {}).get('label', '')}: per-answer +p50 of each round "
                  f"(a fresh observer each): {r['paired_by_round_ms']}")
    print("(milliseconds from the person's send; per answer: the bridge's durable time minus the reference's "
          "seen time for the same answer; targets: bot <= +3 ms at p50, <= +8 ms at p99, no round above +5 ms; "
          "appservice <= +2 ms at p50; encrypted rooms <= +3 ms at p50, <= +10 ms at p99)")


def print_against(rows: list[dict[str, Any]], ref: str) -> None:
    """--against: the source tree's bridge beside the one of ``ref``, measured in
    turn on the same homeserver: per answer over the bare client, pooled over
    every turn, and each pair of turns' difference of per-answer p50s."""
    def pooled(side: list[dict[str, Any]], key: str = "paired") -> list[float]:
        if key == "own":
            return [v for r in side for v in r["samples"].get("own_ms", [])]
        return [b - r for row in side for b, r in zip(row["samples"]["bridge_ms"], row["samples"]["bare_ms"])]

    old = [r for r in rows if r["conditions"]["label"].endswith(f"@{ref}")]
    new = [r for r in rows if not r["conditions"]["label"].endswith(f"@{ref}")]
    print(f"--against {ref}: {len(new)} turns of this tree, {len(old)} of {ref}, taken in turn")
    for name, side in ((ref, old), ("this tree", new)):
        paired, own = pooled(side), pooled(side, "own")
        rounds = [v for r in side for v in r.get("paired_by_round_ms", [])]
        print(f"  {name:<12} n {len(paired):>5}  per answer +p50 {percentile(paired, 50):>6.2f}  "
              f"+p99 {percentile(paired, 99):>6.2f}  own p50 {percentile(own, 50):>6.2f}  "
              f"own p99 {percentile(own, 99):>6.2f}  median of round medians {percentile(rounds, 50):>6.2f}  "
              f"rounds over +5 ms {sum(v > 5 for v in rounds)} of {len(rounds)}  "
              f"cpu/answer {percentile([r['bridge_cpu_ms_per_answer'] for r in side], 50)}")
    diffs = [round(n["paired_p50_ms"] - o["paired_p50_ms"], 2) for o, n in zip(old, new)]
    owns = [round(n.get("own_p50_ms", 0) - o.get("own_p50_ms", 0), 2) for o, n in zip(old, new)]
    print(f"  this tree minus {ref}, turn by turn: per answer +p50 {diffs}; own p50 {owns}")


VARIATIONS = {  # --vary: the harder case with one condition eased at a time
    "hard": HARD, "easy": EASY,
    "one-choice-question": replace(HARD, mixed=False), "no-answerers": replace(HARD, answerers=False),
    "closed-loop": replace(HARD, gap_ms=0), "source-tree": replace(HARD, wheel=False),
    "one-watcher": replace(HARD, watcher_per_round=False),
}


async def main(count: int, modes: list[str], rounds: int | None, variants: list[str],
               encrypted: bool = False, hs_timing: bool = False, against: str | None = None,
               turns: int = 4) -> list[dict[str, Any]]:
    rows = []
    if hs_timing:
        _sync_timing.enable_access_log()
    async with world(appservice="appservice" in modes) as w:
        for mode in modes:
            for name in variants:
                conditions = replace(VARIATIONS[name], encrypted=encrypted)
                if against is None:
                    rows.append(await measure(w, mode, count, {}, rounds, conditions))
                    print_table(rows[-1:])
                    continue
                for turn in range(turns):
                    # Each turn both bridges, the one going first alternating.
                    for code in ([against, None] if turn % 2 == 0 else [None, against]):
                        rows.append(await measure(w, mode, count, {}, rounds, conditions, code=code,
                                                  tag=f"-{'old' if code else 'new'}{turn}"))
                        print_table(rows[-1:])
    print()
    print_table(rows)
    if against is not None:
        print_against(rows, against)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--watch"]:
        watch_main(Path(sys.argv[2]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--rounds", type=int, help="rounds, each with a fresh observer (default: one per 5 answers)")
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--modes", nargs="+", default=["bot", "appservice"], choices=["bot", "appservice"])
    parser.add_argument("--easy", action="store_true", help="the earlier, easier case instead of the harder one")
    parser.add_argument("--vary", nargs="+", choices=sorted(VARIATIONS), metavar="CASE",
                        help=f"measure these cases one after another ({', '.join(VARIATIONS)})")
    parser.add_argument("--encrypted", action="store_true",
                        help="in an end-to-end encrypted room (the person's client encrypts, the bridge decrypts)")
    parser.add_argument("--hs-timing", action="store_true",
                        help="bot mode: also time each /sync from the homeserver's side (its access log)")
    parser.add_argument("--profile", metavar="PREFIX", help="run each bridge under cProfile, stats to PREFIX-<set>.prof")
    parser.add_argument("--stages", metavar="PREFIX",
                        help="bot mode: time each batch's steps (_stages.py), one line a batch to PREFIX-<set>.jsonl")
    parser.add_argument("--against", metavar="GITREF",
                        help="measure this tree's bridge and the one of GITREF in turn, on the same homeserver")
    parser.add_argument("--turns", type=int, default=4, help="with --against: turns of each (default 4)")
    args = parser.parse_args()
    PROFILE = args.profile or ""
    STAGES = args.stages or ""
    variants = args.vary or (["easy"] if args.easy else ["hard"])
    rows = asyncio.run(main(args.count, args.modes, args.rounds, variants, args.encrypted, args.hs_timing,
                            args.against, args.turns))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
