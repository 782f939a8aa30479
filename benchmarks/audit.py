"""The answer log's costs: appending a leaf per answer, and verifying a set.

    python benchmarks/audit.py [--answers 10000] [--appends 2000]

Two rows, on one core:

- append: answers logged one per flushed (durable) store transaction on
  SQLite, with the log on and off in the same run; the difference is what a
  leaf costs an answer on its way from the batch to the disk (canonical
  JSON, a SHA-256 and one row).  Measured at the store, not through a
  homeserver: the round trip there is the same with the log on or off.
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=10_000)
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    figures = {**append_row(args.appends), **verify_row(args.answers)}
    print(json.dumps(figures, indent=2), file=sys.stderr)


if __name__ == "__main__":
    main()
