"""The answer log's costs: appending a leaf per answer, and verifying a set.

    python benchmarks/audit.py [--answers 10000] [--appends 2000] [--synapse 200]

Three rows:

- through Synapse (``--synapse N``, and in ``run_all.py``): send -> durable
  in answers.json, per answer, with the log on and off in the same run on
  the same homeserver.  Two bridges run at once, each its own bot user, room
  and one-question set, one with ``audit.enabled`` true and one false; the
  person answers them in turn (the order swapped every other pair, the next
  answer once the last is durable), so both see the same homeserver, the same
  load and the same answers.  Each pair's difference (on minus off) is what
  the log costs the person waiting for that answer; its median is the
  figure a person feels.
- append: answers logged one per flushed (durable) store transaction on
  SQLite, with the log on and off in the same run; the difference is what a
  leaf costs an answer on its way from the batch to the disk (canonical
  JSON, a SHA-256 and one row), without the homeserver's noise.
- verify: ``askwright-bridge verify``'s check of a set of ``--answers``
  questions, each answered once, against an export of the log (every record
  against its leaf, every inclusion, the checkpoints' signatures and
  consistency).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # _world, latency: the Synapse row

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from bridge.commands import verify as verify_command  # noqa: E402
from bridge.protocol.recorded import RecordedQuestion  # noqa: E402
from bridge.service.auditing.checkpoints import Checkpointer  # noqa: E402
from bridge.service.auditing.keys import LogKey  # noqa: E402
from bridge.service.storage.store import LogEntry, Store  # noqa: E402

ORIGIN = "bench.example/askwright-bridge/bridge"


def _post(store: Store, count: int) -> None:
    with store.transaction():
        store.set_meta("audit_origin", ORIGIN)
        for n in range(count):
            content = {"elicitation_id": f"elc_{n}", "set": "bench",
                       "question": {"id": f"q{n}", "rev": 1, "title": f"Question {n}"}}
            store.record_posted(RecordedQuestion(event_id=f"$q{n}", room_id="!r", set_id="bench", content=content),
                                set_dir="/sets/bench", posted_at=n)


def _entry(n: int, questions: int) -> LogEntry:
    qid = f"q{n % questions}"
    record = {"qid": qid, "state": "answered", "choice": "main", "q_rev": 1, "rev": 1, "updated": "t",
              "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": f"$a{n}",
                         "sender": "@p:hs", "ts": n}}
    return LogEntry(f"$a{n}", "!r", "@p:hs", "answer_event", "accepted", set_id="bench", set_dir="/sets/bench",
                    qid=qid, question_event_id=f"$q{n % questions}", record=record, ts=n)


def append_row(count: int) -> dict[str, float]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, on in (("off", False), ("on", True)):
            store = Store(Path(tmp) / f"{label}.sqlite")
            store.audit_enabled = on
            _post(store, 100)
            began = time.perf_counter()
            for n in range(count):
                with store.transaction():  # flushed: durable before the next
                    store.append_log(_entry(n, 100))
            out[label] = (time.perf_counter() - began) / count * 1000
            store.close()
    return {"append_ms_per_answer_log_off": round(out["off"], 3), "append_ms_per_answer_log_on": round(out["on"], 3),
            "leaf_ms_per_answer": round(out["on"] - out["off"], 3)}


def verify_row(answers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "s.sqlite")
        _post(store, answers)
        with store.transaction(flush=False):
            for n in range(answers):
                store.append_log(_entry(n, answers))
        key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
        signer = Checkpointer(store, key, 60)
        signer.sign_if_grown()
        doc = {"askwright": 1, "set": "bench", "rev": 1,
               "answers": {f"q{n}": store.projection("/sets/bench", f"q{n}") for n in range(answers)}}
        set_dir, log_dir = Path(tmp) / "bench", Path(tmp) / "log"
        set_dir.mkdir()
        (set_dir / "answers.json").write_text(json.dumps(doc))
        from bridge.commands.audit import export

        class _Config:
            class store:  # noqa: N801 - the shape export reads
                path = Path(tmp) / "s.sqlite"

            class audit:  # noqa: N801
                key_file = None

        store.set_meta("audit_key", key.verifier_key)
        export(store, log_dir, _Config)
        store.close()
        began = time.perf_counter()
        args = argparse.Namespace(set_dir=str(set_dir), log=str(log_dir), checkpoint=[], key=None, room=False,
                                  config=None)
        code = verify_command.run(args)
        seconds = time.perf_counter() - began
        assert code == 0, code
    return {"verify_answers": answers, "verify_s": round(seconds, 2)}


async def through_synapse(w: Any, pairs: int) -> dict[str, Any]:
    """send -> durable with the log on and off, ``pairs`` answers each, on ``w``'s Synapse."""
    import latency
    from _world import answer, percentile, question_set

    sides: dict[str, dict[str, Any]] = {}
    procs = []
    for label, on in (("on", True), ("off", False)):
        bot = w.synapse.register(f"auditbot-{label}")
        room = w.synapse.create_room(bot["access_token"], invite=[w.person["user_id"]])
        w.synapse.join(w.person["access_token"], room)
        w.sets_root = w.base / f"sets-audit-{label}"  # each bridge sees only its own set
        w.sets_root.mkdir(exist_ok=True)
        folder = w.add_set(question_set(f"audit-{label}"))
        config = w.config(store={"path": str(w.base / f"audit-{label}.sqlite")}, rooms={"default": room},
                          bot={"user_id": bot["user_id"], "access_token": bot["access_token"]},
                          audit={"enabled": on})
        config = config.rename(w.base / f"audit-{label}.yaml")  # the next bridge's config is written there
        w.start_bridge(config)
        procs.append(w.bridge)
        sides[label] = {"room": room, "folder": folder, "ms": []}
    person = w.client(w.person)
    try:
        questions = await w.question_events(person, 2, prefix="audit-")
        for label, side in sides.items():
            side["question"] = questions[f"audit-{label}/q0"]
            side["watch"] = latency.FileWatch(side["folder"] / "answers.json")
            await side["watch"].start()
        lost = 0
        for n in range(pairs):
            order = ("on", "off") if n % 2 == 0 else ("off", "on")
            took: dict[str, float] = {}
            for label in order:
                side = sides[label]
                sent: dict[str, float] = {}
                await latency.send_one(person, side["room"], ("m.room.message",
                                                              answer(side["question"], "ab"[n % 2])), sent)
                seen = await latency.seen_by_both(sent, side["watch"])
                for event_id in seen:
                    took[label] = (side["watch"].seen[event_id] - sent[event_id]) * 1000
            if len(took) < 2:
                lost += 1
                continue
            for label in took:
                sides[label]["ms"].append(took[label])
        for side in sides.values():
            await side["watch"].stop()
    finally:
        await person.close()
        for proc in procs:
            w.bridge = proc
            w.stop_bridge()
    on, off = sides["on"]["ms"], sides["off"]["ms"]
    paired = [a - b for a, b in zip(on, off)]
    out: dict[str, Any] = {"pairs": pairs, "measured": len(paired), "lost": lost}
    for p in (50, 99):
        out[f"log_on_p{p}_ms"] = round(percentile(on, p), 2)
        out[f"log_off_p{p}_ms"] = round(percentile(off, p), 2)
        out[f"paired_p{p}_ms"] = round(percentile(paired, p), 2)
    out["paired_mean_ms"] = round(sum(paired) / max(1, len(paired)), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--synapse", type=int, default=0, metavar="PAIRS",
                        help="also measure send -> durable through a local Synapse, log on and off (200)")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if args.synapse:
        import asyncio

        from _world import world

        async def run() -> dict[str, Any]:
            async with world() as w:
                return await through_synapse(w, args.synapse)

        figures["synapse"] = asyncio.run(run())
    figures.update({**append_row(args.appends), **verify_row(args.answers)})
    print(json.dumps(figures, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
