"""What answers.json writes reuse between updates, and that reusing never
changes a byte: the kept document, the kept record text, the changed-sets
filter of the folder watcher."""

from __future__ import annotations

import json
import random

import pytest

from bridge.answers import document
from bridge.answers.document import AnswersError
from bridge.answers.file import AnswersFile
from bridge.service.posting.poster import changed_sets

NOW = "2026-11-30T12:00:00.000Z"


def record(qid: str, n: int, **extra) -> dict:
    return {"qid": qid, "choice": "a", "label": "The first way", "matched_guess": n % 2 == 0, "q_rev": 1,
            "source": {"via": "matrix", "how": "answer_event", "event_id": f"$e{n}", "ts": n}, **extra}


def test_dumps_reusing_gives_the_bytes_of_dumps_through_many_updates():
    rng = random.Random(7)
    fragments: document.Fragments = {}
    doc = document.empty("takes")
    assert document.dumps_reusing(doc, fragments) == document.dumps(doc)
    for n in range(300):
        qid = f"q{rng.randrange(40)}"
        if rng.random() < 0.2:
            doc = document.drop_record(doc, qid, NOW)
        else:
            extra = {"note": "é\n\"quoted\"\u2028 " * rng.randrange(3)} if rng.random() < 0.3 else {}
            if rng.random() < 0.2:
                extra["timecodes"] = [{"t": 1.25, "text": "here"}, {"t": 3, "text": ""}]
            doc = document.put_records(doc, {qid: record(qid, n, **extra)}, NOW)
        if n == 150:
            doc = {**doc, "x-extra": {"nested": [1, {"deep": []}], "empty": {}}, "a-first": "ü"}
        assert document.dumps_reusing(doc, fragments) == document.dumps(doc), n
    assert set(fragments) == set(doc["answers"])


def test_an_update_after_another_writer_reads_the_file_again(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    af.update(lambda doc, now: document.put_record(doc, record("arrow", 1), now), NOW)
    # Another writer (same protocol, its own code) replaces the file.
    other = document.put_record(af.load(), record("bow", 2), NOW)
    (tmp_path / "answers.json").write_bytes(document.dumps(other))
    new = af.update(lambda doc, now: document.put_record(doc, record("crow", 3), now), NOW)
    assert set(new["answers"]) == {"arrow", "bow", "crow"}
    assert new["rev"] == 3
    assert af.load() == new
    assert (tmp_path / "answers.json").read_bytes() == document.dumps(new)


def test_a_broken_record_is_refused_before_the_disk_is_touched(tmp_path):
    af = AnswersFile(tmp_path, "takes")
    af.update(lambda doc, now: document.put_record(doc, record("arrow", 1), now), NOW)
    before = (tmp_path / "answers.json").read_bytes()

    def sneaky(doc, now):
        new = document.put_record(doc, record("bow", 2), now)
        new["answers"]["bow"] = {**new["answers"]["bow"], "state": "unsure"}
        return new

    with pytest.raises(AnswersError, match="state"):
        af.update(sneaky, NOW)
    assert (tmp_path / "answers.json").read_bytes() == before


def test_check_changed_checks_what_changed_only():
    doc = document.put_record(document.empty("takes"), record("arrow", 1), NOW)
    document.check_changed(doc, doc)
    shared = dict(doc["answers"])
    shared["bow"] = {"qid": "bow"}
    with pytest.raises(AnswersError, match="bow"):
        document.check_changed({**doc, "answers": shared}, doc)
    with pytest.raises(AnswersError, match="rev"):
        document.check_changed({**doc, "rev": -1}, doc)


def test_changed_sets_follows_the_rules_of_discover(tmp_path):
    root = tmp_path / "sets"
    for folder in ("a", "b/c", ".hidden", "d/attachments", "gone"):
        (root / folder).mkdir(parents=True)
        if folder != "gone":
            (root / folder / "questions.json").write_text(json.dumps({}))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "questions.json").write_text("{}")
    (root / "link").symlink_to(outside, target_is_directory=True)
    # A questions.json that is itself a link out of the root: refused at the
    # start's scan, it was posted when the watcher saw it made.
    (root / "leaky").mkdir()
    (root / "leaky" / "questions.json").symlink_to(outside / "questions.json")
    changed = [root / "a" / "questions.json", root / "b" / "c" / "questions.json", root / "a" / "answers.json",
               root / ".hidden" / "questions.json", root / "d" / "attachments" / "questions.json",
               root / "gone" / "questions.json", root / "link" / "questions.json", outside / "questions.json",
               root / "leaky" / "questions.json"]
    assert changed_sets(root, [str(p) for p in changed]) == [root / "a", root / "b" / "c"]
