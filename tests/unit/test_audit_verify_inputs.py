"""``askwright-bridge verify`` on bad input: whatever is corrupt, truncated,
forged or out of range is named, and the exit is 1 (something does not hold)
or 2 (an input can't be read), never a traceback."""

from __future__ import annotations

import argparse
import base64
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands import verify
from bridge.commands.audit import export
from bridge.protocol import audit_leaf, audit_verify, checkpoint as cp, merkle
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.auditing.checkpoints import Checkpointer
from bridge.service.auditing.keys import LogKey
from bridge.service.storage.store import LogEntry, Store

ORIGIN = "example.org/askwright-bridge/bridge"
QUESTIONS = 3
SIGNING: dict[Path, Ed25519PrivateKey] = {}  # the good export's folder -> the log's signing key


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A set folder and the export of its log that verify as they are."""
    base = tmp_path_factory.mktemp("good")
    store = Store(base / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", ORIGIN)
        for n in range(QUESTIONS):
            content = {"elicitation_id": f"elc_{n}", "set": "s", "question": {"id": f"q{n}", "rev": 1, "title": "T"}}
            store.record_posted(RecordedQuestion(event_id=f"$q{n}", room_id="!r", set_id="s", content=content),
                                set_dir="/sets/s", posted_at=n)
        for n in range(QUESTIONS):
            record = {"qid": f"q{n}", "state": "answered", "choice": "main", "q_rev": 1, "rev": 1, "updated": "t",
                      "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": f"$a{n}",
                                 "sender": "@ana:hs", "ts": n}}
            store.append_log(LogEntry(f"$a{n}", "!r", "@ana:hs", "answer_event", "accepted", set_id="s",
                                      set_dir="/sets/s", qid=f"q{n}", question_event_id=f"$q{n}", record=record, ts=n))
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    SIGNING[base] = key.private
    Checkpointer(store, key, 60).sign_if_grown()
    store.set_meta("audit_key", key.verifier_key)
    doc = {"askwright": 1, "set": "s", "rev": 1,
           "answers": {f"q{n}": store.projection("/sets/s", f"q{n}") for n in range(QUESTIONS)}}
    (base / "set").mkdir()
    (base / "set" / "answers.json").write_text(json.dumps(doc))

    class _Config:
        class store:  # noqa: N801 - the shape export reads
            path = base / "s.sqlite"

        class audit:  # noqa: N801
            key_file = None

    assert export(store, base / "log", _Config) == 0
    store.close()
    return base


def _run(good: Path, tmp_path: Path, change: Callable[[Path], None], *checkpoints: str,
         capsys: pytest.CaptureFixture) -> tuple[int, str]:
    case = tmp_path / "case"
    shutil.copytree(good / "set", case / "set")
    shutil.copytree(good / "log", case / "log")
    change(case)
    args = argparse.Namespace(set_dir=str(case / "set"), log=str(case / "log"),
                              checkpoint=[str(case / c) for c in checkpoints], key=None, room=False, config=None)
    code = verify.run(args)  # a traceback fails the test
    out = capsys.readouterr()
    return code, out.out + out.err


def _record(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(case: Path) -> None:
        path = case / "set" / "answers.json"
        doc = json.loads(path.read_text())
        change(doc["answers"]["q0"])
        path.write_text(json.dumps(doc))
    return apply


def _doc(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(case: Path) -> None:
        path = case / "set" / "answers.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return apply


def _text_of(relative: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    return lambda case: (case / relative).write_text(change((case / relative).read_text()))


def _write(relative: str, data: bytes) -> Callable[[Path], None]:
    return lambda case: (case / relative).write_bytes(data)


def _leaves(good: Path) -> bytes:
    return (good / "log" / "leaves.jsonl").read_bytes()


def test_the_good_export_holds(good, tmp_path, capsys):
    assert _run(good, tmp_path, lambda case: None, capsys=capsys) == (0, f"all holds: {QUESTIONS} records, "
                                                                         f"{QUESTIONS} leaves, latest checkpoint "
                                                                         f"{QUESTIONS}, 0 earlier checkpoints\n")


CASES = {
    # a corrupt or truncated export
    "leaves cut mid-line": (lambda g: _write("log/leaves.jsonl", _leaves(g)[:-7]), 2, "truncated"),
    # (a truncated export is an input that can't be read whole: exit 2, as docs/audit.md says)
    "leaves cut at a line": (lambda g: _write("log/leaves.jsonl", _leaves(g).split(b"\n", 1)[0] + b"\n"), 2,
                             "the export holds only 1 leaves (truncated)"),
    "leaves nested too deep": (lambda g: _write("log/leaves.jsonl", b"[" * 100_000 + b"\n"
                                                + _leaves(g).split(b"\n", 1)[1]), 1, "leaf 0: does not parse"),
    "a leaf not UTF-8": (lambda g: _write("log/leaves.jsonl", b"\xff" + _leaves(g)), 1, "leaf 0: does not parse"),
    "a leaf not canonical": (lambda g: _write("log/leaves.jsonl", _leaves(g).replace(b'"v":1', b'"v": 1', 1)), 1,
                             "leaf 0: does not parse (not in canonical form"),
    "the key garbled": (lambda g: _write("log/key.txt", b"garbage\n"), 2, "the log's key: not a verifier key"),
    "the key missing": (lambda g: lambda case: (case / "log" / "key.txt").unlink(), 2, "key.txt: can't be read"),
    "a checkpoint cut": (lambda g: _write(f"log/checkpoints/{QUESTIONS}.txt", f"{ORIGIN}\n{QUESTIONS}\n".encode()),
                         1, "not a signed note"),
    "a checkpoint not UTF-8": (lambda g: _write(f"log/checkpoints/{QUESTIONS}.txt", b"\xff\n\n"), 2,
                               "can't be read"),
    "answers.json nested too deep": (lambda g: _write("set/answers.json", b"[" * 100_000), 2, "nested too deep"),
    "answers.json with NaN": (lambda g: _write("set/answers.json", b'{"answers": {"q0": {"choice": NaN}}}'), 2,
                              "NaN is not JSON"),
    "answers.json a list": (lambda g: _write("set/answers.json", b"[]"), 1, "answers.json has no answers object"),
    # (a set or a decider that is no string was a dict key: a traceback)
    "answers.json's set a list": (lambda g: _doc(lambda d: d.update(set=["s"])), 1,
                                  "answers.json names no set (its set is a list)"),
    "a decider an object": (lambda g: _record(lambda r: r.update(state="answered", votes=[],
                                                                 decided_by=[{"a": 1}, [1]])), 1,
                            "record 'q0' (leaf 0): decided_by names an object, not a Matrix user id"),
    # a reader keeping the first of two values would act on what the log never recorded
    "a record naming a key twice": (lambda g: _text_of("set/answers.json", lambda t: t.replace(
        '"choice": "main"', '"choice": "reject", "choice": "main"', 1)), 1,
        "answers.json: the key 'choice' appears twice in one object: readers disagree on which value it holds"),
    # (a tree size past what int() reads was a traceback, once its signature held)
    "a checkpoint's size of 5000 digits": (lambda g: _write(f"log/checkpoints/{QUESTIONS}.txt", cp.sign(
        f"{ORIGIN}\n{'9' * 5000}\n{'A' * 43}=\n", ORIGIN, SIGNING[g]).encode()), 1, "tree size is too large"),
    # a receipt pointing past the tree, or malformed
    # (answered after the export was taken, or forged: nothing in the export vouches for it, said as such)
    "a receipt past the tree": (lambda g: _record(lambda r: r["receipt"].update(index=10 ** 30)), 1,
                                "record 'q0' (leaf 1000000000000000000000000000000): past the 3 leaves of this "
                                "export (answered after it was taken, or never logged); export again to check it"),
    "a receipt before the tree": (lambda g: _record(lambda r: r["receipt"].update(index=-1)), 1,
                                  "the receipt points before the tree"),
    "a receipt's index a string": (lambda g: _record(lambda r: r["receipt"].update(index="0")), 1,
                                   "record 'q0': the receipt is malformed"),
    # a record changed to what JCS can't express
    "a choice past 2^53": (lambda g: _record(lambda r: r.update(choice=2 ** 70)), 1,
                           "record 'q0' (leaf 0): the record's answer (choice, q_rev, qid, state) can't be "
                           "canonicalised"),
    "a choice with a lone surrogate": (lambda g: _record(lambda r: r.update(choice="\ud800")), 1,
                                       "can't be canonicalised"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_named_with_exit_1_or_2(good, tmp_path, capsys, name):
    make, code, words = CASES[name]
    got, said = _run(good, tmp_path, make(good), capsys=capsys)
    assert (got, words in said) == (code, True), said
    assert "Traceback" not in said


def test_leaves_past_the_latest_checkpoint_are_named_as_covered_by_no_signature(good, tmp_path, capsys):
    """A copy of the last leaf appended to the export: verify said "all
    holds" and nothing of a leaf no signature covers."""
    last = _leaves(good).rstrip(b"\n").rsplit(b"\n", 1)[-1]
    code, said = _run(good, tmp_path, _write("log/leaves.jsonl", _leaves(good) + last + b"\n"), capsys=capsys)
    assert code == 0 and f"all holds: {QUESTIONS} records, {QUESTIONS + 1} leaves" in said, said
    assert "note: the last 1 leaves are under no checkpoint" in said, said
    code, said = _run(good, tmp_path / "as-exported", lambda case: None, capsys=capsys)
    assert code == 0 and "under no checkpoint" not in said


def test_a_checkpoint_signed_by_another_key_is_named(good, tmp_path, capsys):
    hashes = [merkle.leaf_hash(line) for line in _leaves(good).split(b"\n")[:-1]]
    forged = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, len(hashes), merkle.root(hashes)), Ed25519PrivateKey.generate())
    state = json.dumps({"type": "dev.superpipeline.answer_log.checkpoint", "content": {"checkpoint": forged}})
    code, said = _run(good, tmp_path, _write("forged.json", state.encode()), "forged.json", capsys=capsys)
    assert code == 1 and "not signed by the log's key" in said
    code, said = _run(good, tmp_path / "2", _write("bad.json", b'{"content": {"checkpoint": ['), "bad.json",
                      capsys=capsys)
    assert code == 2 and "bad.json: not JSON" in said


def test_a_checkpoint_from_the_room_newer_than_the_export_is_named_not_taken_for_a_truncation(good, tmp_path, capsys):
    """A bridge running on signs a checkpoint after the export: the room's
    (given with --room or --checkpoint) is larger than the exported log.
    That read as a truncated export, exit 1, and nothing else was checked."""
    lines = _leaves(good).split(b"\n")[:-1]

    def exported_at_two(case: Path) -> None:
        (case / "log" / "leaves.jsonl").write_bytes(b"\n".join(lines[:2]) + b"\n")
        newest = case / "log" / "checkpoints" / f"{QUESTIONS}.txt"
        newest.rename(case / "from-the-room.txt")
        two = cp.Checkpoint(ORIGIN, 2, merkle.root([merkle.leaf_hash(line) for line in lines[:2]]))
        (case / "log" / "checkpoints" / "2.txt").write_text(cp.sign_checkpoint(two, SIGNING[good]))
        path = case / "set" / "answers.json"
        doc = json.loads(path.read_text())
        del doc["answers"]["q2"]  # answered after the export was made
        path.write_text(json.dumps(doc))

    code, said = _run(good, tmp_path, exported_at_two, "from-the-room.txt", capsys=capsys)
    assert code == 0, said
    assert "newer than the export (up to size 3; the export holds 2 leaves)" in said
    assert "all holds: 2 records, 2 leaves, latest checkpoint 2" in said

    # Two newer checkpoints of one size with different roots are a fork of
    # the log, whatever the export holds: that passed with exit 0.
    def and_a_fork(case: Path) -> None:
        exported_at_two(case)
        other = cp.Checkpoint(ORIGIN, 3, merkle.root([merkle.leaf_hash(line) for line in lines[:2]]
                                                     + [merkle.leaf_hash(b"another third leaf")]))
        (case / "forked.txt").write_text(cp.sign_checkpoint(other, SIGNING[good]))

    code, said = _run(good, tmp_path / "fork", and_a_fork, "from-the-room.txt", "forked.txt", capsys=capsys)
    assert code == 1 and "two checkpoints of size 3 sign different roots (a fork of the log" in said, said


async def test_the_mcp_verify_tool_checks_one_set_at_a_time(monkeypatch):
    # Each check holds the whole log (its leaves parsed, its tree): three at
    # once over 400,000 leaves took the bridge from 120 MB to 4 GB.
    import asyncio

    from bridge.agents import log_verify

    running, most = [0], [0]

    async def check(*_args):
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1
        return {"ok": True}

    monkeypatch.setattr(log_verify, "_verify", check)
    results = await asyncio.gather(*(log_verify.verify_tool(None, lambda: None, "a", "s", []) for _ in range(3)))
    assert results == [{"ok": True}] * 3 and most[0] == 1


@pytest.mark.parametrize("before", ["all_checkpoints", "size", "leaves"])
async def test_the_mcp_verify_tool_holds_while_an_answer_is_logged_and_signed_as_it_reads(good, tmp_path, before):
    """An answer logged, signed (another agent's checkpoint request, the
    bridge's minute) and written to answers.json between two of the tool's
    reads: a checkpoint past the leaves it read was taken for a truncated
    log, a record replaced since the file was read for one the log took
    back, and a healthy log was reported as not holding."""
    from bridge.agents import log_verify

    shutil.copy(good / "s.sqlite", tmp_path / "s.sqlite")
    shutil.copytree(good / "set", tmp_path / "set")
    store = Store(tmp_path / "s.sqlite")
    checkpointer = Checkpointer(store, LogKey(ORIGIN, SIGNING[good]), 60)
    reading, logged = store.run, []

    def an_answer_logged_signed_and_written() -> None:
        record = {"qid": "q0", "state": "answered", "choice": "main", "q_rev": 1, "rev": 1, "updated": "t",
                  "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": "$late",
                             "sender": "@bo:hs", "ts": 9}}
        with store.transaction():
            store.append_log(LogEntry("$late", "!r", "@bo:hs", "answer_event", "accepted", set_id="s",
                                      set_dir="/sets/s", qid="q0", question_event_id="$q0", record=record, ts=9))
        checkpointer.sign_if_grown()
        doc = {"askwright": 1, "set": "s", "rev": 1,
               "answers": {f"q{n}": store.projection("/sets/s", f"q{n}") for n in range(QUESTIONS)}}
        (tmp_path / "set" / "answers.json").write_text(json.dumps(doc))

    async def run(fn, *args, **kwargs):
        if not logged and getattr(fn, "__name__", "") == before:
            logged.append(True)
            await reading(an_answer_logged_signed_and_written)
        return await reading(fn, *args, **kwargs)

    class Sets:
        def set_dir(self, _agent: str, _set_id: str) -> Path:
            return tmp_path / "set"

    store.run = run  # type: ignore[method-assign]
    try:
        result = await log_verify.verify_tool(Sets(), lambda: store, "a", "s", [])
    finally:
        store.close()
    assert logged and result["holds"], result["problems"]
    assert result["leaves"] == QUESTIONS + 1


def test_a_questions_file_with_a_byte_order_mark_is_read_as_the_bridge_reads_it(good, tmp_path, capsys):
    """An editor's byte-order mark: lint, read, status and the bridge take the
    set; verify stopped at it (exit 2, "Unexpected UTF-8 BOM")."""
    def with_bom(case: Path) -> None:
        (case / "set" / "questions.json").write_text(
            "\ufeff" + json.dumps({"askwright": 1, "id": "s", "title": "S", "questions": []}), encoding="utf-8")

    code, said = _run(good, tmp_path, with_bom, capsys=capsys)
    assert code == 0, said



def _appended_withdrawal(case: Path) -> None:
    """A withdrawal of q0's answer appended past the checkpoint (anyone can
    write one: it is canonical JSON), and q0's record dropped to match it."""
    path = case / "log" / "leaves.jsonl"
    first = json.loads(path.read_bytes().split(b"\n", 1)[0])
    forged = {**first, "outcome": "withdrawn", "event_id": "$w0", "replaces": first["event_id"], "ts": 99}
    path.write_bytes(path.read_bytes() + audit_leaf.canonical(forged) + b"\n")
    answers = case / "set" / "answers.json"
    doc = json.loads(answers.read_text())
    del doc["answers"]["q0"]
    answers.write_text(json.dumps(doc))


@pytest.mark.parametrize("change, words", [
    # A tally's empty vote list made the record's standing answer go unread.
    (_record(lambda r: (r.pop("receipt"), r.update(choice="stable", votes=[]), r["source"].update(via="agent"))),
     "record 'q0': no receipt, where the log's answer that stands is leaf 0"),
    # Leaves no checkpoint covers are nobody's evidence.
    (_appended_withdrawal, "question 'q0': the log's answer that stands is leaf 0, but answers.json has no record"),
], ids=["a record rewritten as a tally without its receipt", "a withdrawal appended past the checkpoint"])
def test_a_record_rewritten_without_the_key_is_named(good, tmp_path, capsys, change, words):
    got, said = _run(good, tmp_path, change, capsys=capsys)
    assert got == 1 and words in said, said


def test_a_changed_leaf_is_placed_between_the_checkpoints_that_hold_and_the_first_that_does_not():
    """Every checkpoint but the latest was blamed as "not consistent" (a fork
    by the operator, to a reader) when a leaf after them changed."""
    key = Ed25519PrivateKey.generate()
    leaves = [audit_leaf_bytes(n) for n in range(8)]
    hashes = [merkle.leaf_hash(leaf) for leaf in leaves]
    notes = [cp.sign_checkpoint(cp.Checkpoint(ORIGIN, size, merkle.root(hashes[:size])), key) for size in (2, 5, 8)]
    leaves[3] = audit_leaf_bytes(33)
    verdict, _hashes, _latest = audit_verify.verify_log(leaves, notes, ORIGIN, cp.raw_public(key.public_key()))
    assert verdict.problems == ["checkpoint of size 8: the exported leaves do not make the tree it signs (a leaf "
                                "was changed, dropped or added): a leaf from 2 to 4 is not what the checkpoints "
                                "signed"], verdict.problems
    empty = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 0, bytes(32)), key)  # any root but the empty tree's
    verdict, _hashes, _latest = audit_verify.verify_log(leaves[:3] + [audit_leaf_bytes(3)] + leaves[4:],
                                                        [*notes, empty], ORIGIN, cp.raw_public(key.public_key()))
    assert verdict.problems == ["checkpoint of size 0: its root is not the empty tree's"]


def test_one_changed_leaf_leaves_the_records_an_earlier_checkpoint_still_vouches_for_unblamed():
    """One changed byte in leaf 6 made every record of the set "not included
    under the latest checkpoint", those under the checkpoint of size 4 too,
    which the leaves still make: the one wrong entry was lost among nine."""
    key = Ed25519PrivateKey.generate()
    leaves, answers = [], {}
    for n in range(9):
        record = {"qid": f"q{n}", "state": "answered", "choice": "yes", "q_rev": 1}
        leaf = audit_leaf.canonical(audit_leaf.build_leaf(
            outcome="accepted", set_id="s", room_id="!r:x", event_id=f"$a{n}", sender="@ana:x", ts=1000 + n,
            via="answer_event", question={"question": {"id": f"q{n}", "rev": 1}}, question_event_id=f"$q{n}",
            record=record))
        leaves.append(leaf)
        answers[f"q{n}"] = {**record, "source": {"via": "matrix", "event_id": f"$a{n}", "sender": "@ana:x",
                                                  "room_id": "!r:x", "ts": 1000 + n},
                            "receipt": {"log": ORIGIN, "index": n, "leaf": merkle.leaf_hash(leaf).hex()}}
    hashes = [merkle.leaf_hash(leaf) for leaf in leaves]
    notes = [cp.sign_checkpoint(cp.Checkpoint(ORIGIN, size, merkle.root(hashes[:size])), key) for size in (1, 4, 9)]
    public = cp.raw_public(key.public_key())
    assert audit_verify.verify_set({"set": "s", "answers": answers}, leaves, notes, ORIGIN, public).holds
    changed = leaves[6].replace(b'"reason":null', b'"reason":"x"')
    assert changed != leaves[6]
    leaves[6] = changed
    problems = audit_verify.verify_set({"set": "s", "answers": answers}, leaves, notes, ORIGIN, public).problems
    assert not [p for p in problems if p.startswith(("record 'q0'", "record 'q1'", "record 'q2'", "record 'q3'"))], \
        problems
    assert "record 'q6' (leaf 6): the receipt's leaf hash differs from the log's leaf" in problems
    assert "record 'q5' (leaf 5): no checkpoint given vouches for it: the leaves from 4 on are not what the " \
           "checkpoints signed" in problems
    assert any("a leaf from 4 to 8 is not what the checkpoints signed" in p for p in problems)


def audit_leaf_bytes(n: int) -> bytes:
    return audit_leaf.canonical({"v": 1, "outcome": "accepted", "event_id": f"$a{n}", "ts": n, "set": "s",
                                 "question": {"id": f"q{n}", "rev": 1}})


def test_a_checkpoint_holding_a_lone_surrogate_is_named_not_a_traceback(good, tmp_path, capsys):
    """JSON reads "\\ud800" into a string no UTF-8 can hold: encoding it for
    the signature check raised UnicodeEncodeError out of ``verify``."""
    blob = base64.b64encode(cp.key_hash(ORIGIN, _public(good)) + bytes(64)).decode()
    note = f"{ORIGIN}\n1\n\ud800\n\n\u2014 {ORIGIN} {blob}\n"
    state = json.dumps({"checkpoint": note})  # ASCII: the surrogate written as \ud800
    code, said = _run(good, tmp_path, _write("odd.json", state.encode()), "odd.json", capsys=capsys)
    assert code == 1 and "a note is UTF-8 text" in said, said


def _public(good: Path) -> bytes:
    return cp.parse_verifier_key((good / "log" / "key.txt").read_text().strip())[1]


@pytest.mark.parametrize("questions", [None, {"questions": [{"id": "q0", "kind": "choice"}]}],
                         ids=["no-questions-file", "question-without-quorum"])
def test_an_answer_rewritten_as_pending_is_named(good, tmp_path, capsys, questions):
    """Ana's answer to q0 stands in the log; its record rewritten as a
    pending approval with no votes (receipt kept) was read as a tally: the
    answer's hash went unchecked and verify said all holds, exit 0, with or
    without a questions.json saying q0 needs no quorum."""
    def pending(case: Path) -> None:
        _record(lambda r: (r.update(state="pending", votes=[]), r.pop("choice")))(case)
        if questions is not None:
            (case / "set" / "questions.json").write_text(json.dumps(questions))

    code, out = _run(good, tmp_path, pending, capsys=capsys)
    assert code == 1, out
    assert "record 'q0': the record says pending, and the log's answer that stands (leaf 0)" in out
