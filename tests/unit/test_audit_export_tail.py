"""An export taken between two of the bridge's checkpoints: the leaves logged
since the latest are signed with the log's key where it can be read, so an
answer given a moment ago checks out; never over a log changed under a
checkpoint, and without the key the export says why ``verify`` names them."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands import verify
from bridge.commands.audit import export
from bridge.service.auditing.checkpoints import Checkpointer
from bridge.service.auditing.keys import LogKey, key_file, write_key
from bridge.service.storage.store import LogEntry, Store

ORIGIN = "example.org/askwright-bridge/bridge"


def _answer(store: Store, n: int) -> None:
    record = {"qid": f"q{n}", "state": "answered", "choice": "main", "q_rev": 1, "rev": 1, "updated": "t",
              "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": f"$a{n}",
                         "sender": "@ana:hs", "ts": n}}
    from bridge.protocol.recorded import RecordedQuestion

    content = {"elicitation_id": f"elc_{n}", "set": "s", "question": {"id": f"q{n}", "rev": 1, "title": "T"}}
    with store.transaction():
        store.record_posted(RecordedQuestion(event_id=f"$q{n}", room_id="!r", set_id="s", content=content),
                            set_dir="/sets/s", posted_at=n)
        store.append_log(LogEntry(f"$a{n}", "!r", "@ana:hs", "answer_event", "accepted", set_id="s",
                                  set_dir="/sets/s", qid=f"q{n}", question_event_id=f"$q{n}", record=record, ts=n))


@pytest.fixture
def between(tmp_path) -> Path:
    """Two answers under the bridge's latest checkpoint, a third and a fourth logged since."""
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", ORIGIN)
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    write_key(key_file(tmp_path / "s.sqlite"), key)
    for n in range(2):
        _answer(store, n)
    Checkpointer(store, key, 60).sign_if_grown()
    store.set_meta("audit_key", key.verifier_key)
    _answer(store, 2)
    _answer(store, 3)
    doc = {"askwright": 1, "set": "s", "rev": 1, "answers": {f"q{n}": store.projection("/sets/s", f"q{n}")
                                                            for n in range(4)}}
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "answers.json").write_text(json.dumps(doc))
    store.close()
    return tmp_path


def _export_and_verify(base: Path, capsys) -> tuple[int, int, str]:
    class _Config:
        class store:  # noqa: N801 - the shape export reads
            path = base / "s.sqlite"

        class audit:  # noqa: N801
            key_file = None

    store = Store.read_only(base / "s.sqlite")
    try:
        exported = export(store, base / "log", _Config)
    finally:
        store.close()
    args = argparse.Namespace(set_dir=str(base / "set"), log=str(base / "log"), checkpoint=[], key=None,
                              room=False, config=None)
    verified = verify.run(args)
    out = capsys.readouterr()
    return exported, verified, out.out + out.err


def test_the_answer_logged_since_the_latest_checkpoint_checks_out(between, capsys):
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 0), said
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt", "4.txt"]
    assert "all holds: 4 records, 4 leaves, latest checkpoint 4, 1 earlier checkpoints" in said


def test_without_the_key_the_export_says_why_verify_names_the_new_answer(between, capsys):
    key_file(between / "s.sqlite").unlink()
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 1)
    assert "the 2 leaves logged since the latest checkpoint (size 2) are not signed yet" in said
    assert "record 'q2' (leaf 2): not yet under the latest checkpoint (size 2)" in said


def test_a_leaf_changed_under_the_checkpoint_is_never_signed_over(between, capsys):
    db = sqlite3.connect(between / "s.sqlite")
    leaf = json.loads(db.execute("SELECT leaf FROM audit_leaf WHERE idx=0").fetchone()[0])
    leaf["choice"] = "stable"
    from bridge.protocol import merkle
    from rfc8785 import dumps

    data = dumps(leaf)
    db.execute("UPDATE audit_leaf SET leaf=?, hash=? WHERE idx=0", (data.decode(), merkle.leaf_hash(data).hex()))
    db.commit()
    db.close()
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 1)
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt"]
    assert "are not signed: the first 2 leaves are not those the latest checkpoint signed" in said


def test_a_leaf_changed_under_a_checkpoint_forged_to_match_is_never_signed_over(between, capsys):
    """The leaf changed and the stored checkpoint replaced by one over the
    new leaves, signed by another key: the log's key would vouch for it."""
    from bridge.protocol import checkpoint as cp, merkle
    from rfc8785 import dumps

    db = sqlite3.connect(between / "s.sqlite")
    leaf = json.loads(db.execute("SELECT leaf FROM audit_leaf WHERE idx=0").fetchone()[0])
    leaf["choice"] = "stable"
    data = dumps(leaf)
    db.execute("UPDATE audit_leaf SET leaf=?, hash=? WHERE idx=0", (data.decode(), merkle.leaf_hash(data).hex()))
    hashes = [bytes.fromhex(h) for (h,) in db.execute("SELECT hash FROM audit_leaf WHERE idx<2 ORDER BY idx")]
    forged = cp.sign_checkpoint(cp.Checkpoint(ORIGIN, 2, merkle.root(hashes)), Ed25519PrivateKey.generate())
    db.execute("UPDATE audit_checkpoint SET note=? WHERE size=2", (forged,))
    db.commit()
    db.close()
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 1)
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt"]
    assert "are not signed: the latest checkpoint is not one this log's key signed" in said


@pytest.mark.parametrize("damage, said_why", [
    ("DELETE FROM audit_leaf WHERE idx=2", "leaf 2 is missing from the store"),
    ("UPDATE audit_leaf SET leaf=replace(leaf, '@ana:hs', '@eve:hs') WHERE idx=3", "leaf 3's text is not what its stored hash says"),
], ids=["a leaf taken out", "a leaf's text changed"])
def test_a_log_changed_past_the_checkpoint_is_never_signed_over(between, capsys, damage, said_why):
    """Past the latest checkpoint, a leaf taken out (the later ones shifted
    down) or a leaf's text changed with its stored hash left: the running
    bridge refuses the first and signs the stored hashes for the second, so
    a checkpoint over these would be a second tree under the same key."""
    db = sqlite3.connect(between / "s.sqlite")
    db.execute(damage)
    db.commit()
    db.close()
    exported, _verified, said = _export_and_verify(between, capsys)
    assert exported == 0
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt"]
    assert f"are not signed: {said_why}" in said


def test_a_store_cut_back_below_its_latest_checkpoint_is_never_signed_over(between, capsys):
    """Checkpoint 5 published, the store then cut back to 3 leaves and a new
    answer logged as leaf 3: a tail over these 4 would be another tree than
    the one checkpoint 5 signed, under the same key (the running bridge
    refuses to sign on)."""
    from bridge.service.auditing.keys import read_key

    store = Store(between / "s.sqlite")
    _answer(store, 4)
    Checkpointer(store, read_key(key_file(between / "s.sqlite")), 60).sign_if_grown()
    store.db.execute("DELETE FROM audit_leaf WHERE idx>=3")
    _answer(store, 7)
    store.close()
    exported, _verified, said = _export_and_verify(between, capsys)
    assert exported == 0
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt"]
    assert "are not signed: the store holds 4 leaves, fewer than the 5 its latest checkpoint signed" in said


def test_a_leaf_changed_with_every_checkpoint_deleted_is_checked_against_the_one_beside_the_key(between, capsys):
    """The store's checkpoints all deleted and a leaf changed: the export
    signed the rewritten log as a tail from 0, under the log's key."""
    from bridge.protocol import merkle
    from bridge.service.auditing.keys import read_key
    from bridge.service.auditing.witness import witness_file
    from rfc8785 import dumps

    path = key_file(between / "s.sqlite")
    store = Store(between / "s.sqlite")
    Checkpointer(store, read_key(path), 60, witness=witness_file(path)).sign_if_grown()  # the bridge's own: 4
    store.close()
    db = sqlite3.connect(between / "s.sqlite")
    leaf = json.loads(db.execute("SELECT leaf FROM audit_leaf WHERE idx=0").fetchone()[0])
    leaf["choice"] = "stable"
    data = dumps(leaf)
    db.execute("UPDATE audit_leaf SET leaf=?, hash=? WHERE idx=0", (data.decode(), merkle.leaf_hash(data).hex()))
    db.execute("DELETE FROM audit_checkpoint")
    db.commit()
    db.close()
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 1)
    assert not list((between / "log" / "checkpoints").iterdir())
    assert "are not signed: the first 4 leaves are not those" in said


def test_a_store_restored_from_before_an_exports_tail_is_not_signed_on(between, capsys):
    """The export signed a tail over 4 leaves with the log's key; the store
    was then restored from a backup of 2 and two other answers logged: the
    bridge signed another tree of size 4 under the same key, a fork only
    whoever kept the export's checkpoint could see."""
    from bridge.service.auditing.checkpoints import LogDamaged
    from bridge.service.auditing.keys import read_key
    from bridge.service.auditing.witness import keep_witness, witness_file

    path = key_file(between / "s.sqlite")
    store = Store(between / "s.sqlite")
    keep_witness(witness_file(path), store.audit.latest_checkpoint()[1])  # the bridge's own latest: size 2
    store.close()
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 0), said
    assert sorted(p.name for p in (between / "log" / "checkpoints").iterdir()) == ["2.txt", "4.txt"]
    store = Store(between / "s.sqlite")
    try:
        store.db.execute("DELETE FROM audit_leaf WHERE idx>=2")  # a backup from before the third answer
        _answer(store, 8)
        _answer(store, 9)
        with pytest.raises(LogDamaged, match="fewer than the 4|not those"):
            Checkpointer(store, read_key(path), 60, witness=witness_file(path)).sign_if_grown()
    finally:
        store.close()


def test_an_answer_logged_while_the_export_reads_is_left_to_the_next(between, capsys, monkeypatch):
    """The bridge logs a fifth answer right after the export counted four:
    the export is of four leaves throughout (leaves.jsonl, log.json, the
    tail's size and file name)."""
    from bridge.service.storage.auditlog import AuditLog

    counted = AuditLog.size

    def count_then_log(self: AuditLog) -> int:
        monkeypatch.setattr(AuditLog, "size", counted)
        n = counted(self)
        writer = Store(between / "s.sqlite")
        _answer(writer, 4)
        writer.close()
        return n

    monkeypatch.setattr(AuditLog, "size", count_then_log)
    exported, verified, said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 0), said
    assert len((between / "log" / "leaves.jsonl").read_text().splitlines()) == 4
    assert json.loads((between / "log" / "log.json").read_text())["size"] == 4
    from bridge.protocol import checkpoint

    tail = (between / "log" / "checkpoints" / "4.txt").read_text()
    assert checkpoint.parse_checkpoint(tail.split("\n\n", 1)[0] + "\n").size == 4


def test_an_empty_log_exports_the_empty_trees_checkpoint_and_records_from_before_it_check_out(tmp_path, capsys):
    """The log turned on after the answers: no leaf, no checkpoint (the
    bridge signs one when the log grows), and verify said 1 problem, exit 1,
    of a log where nothing is wrong."""
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("audit_origin", ORIGIN)
    key = LogKey(ORIGIN, Ed25519PrivateKey.generate())
    write_key(key_file(tmp_path / "s.sqlite"), key)
    store.set_meta("audit_key", key.verifier_key)
    store.close()
    record = {"qid": "q0", "state": "answered", "choice": "main", "q_rev": 1, "rev": 1, "updated": "t",
              "source": {"via": "matrix", "how": "answer_event", "room_id": "!r", "event_id": "$a0",
                         "sender": "@ana:hs", "ts": 5}}
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "answers.json").write_text(json.dumps({"askwright": 1, "set": "s", "rev": 1,
                                                               "answers": {"q0": record}}))
    exported, verified, said = _export_and_verify(tmp_path, capsys)
    assert (exported, verified) == (0, 0), said
    assert sorted(p.name for p in (tmp_path / "log" / "checkpoints").iterdir()) == ["0.txt"]


def test_a_checkpoint_file_turned_to_crlf_is_not_the_note_that_was_signed(between, capsys):
    # read_text's newline translation made it the signed note again; C2SP's
    # readers (Go's note.Open) refuse a carriage return.
    exported, verified, _said = _export_and_verify(between, capsys)
    assert (exported, verified) == (0, 0)
    for note in (between / "log" / "checkpoints").iterdir():
        note.write_bytes(note.read_bytes().replace(b"\n", b"\r\n"))
    args = argparse.Namespace(set_dir=str(between / "set"), log=str(between / "log"), checkpoint=[], key=None,
                              room=False, config=None)
    assert verify.run(args) != 0
