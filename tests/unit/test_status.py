"""``askwright-bridge status``: every set's counts, from the store and from read's own view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bridge.answers.document import put_record
from bridge.answers.file import AnswersFile
from bridge.cli import main
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.operators.setstatus import SetStatus, count_view, format_table
from bridge.service.storage.store import SCHEMA_VERSION, Store

NOW = "2026-11-30T12:00:00.000Z"


def text_q(qid: str, rev: int = 1, status: str = "open") -> dict:
    """A question lint passes (a set that fails it is a row saying so)."""
    return {"id": qid, "kind": "text", "title": qid.title(), "question": f"What about {qid}?", "rev": rev,
            "status": status, "why": "It decides the next step.",
            "guess": {"text": "Fine.", "why": "As before.", "confidence": "low"}}


def write_set(root: Path, folder: str, set_id: str, questions: list[dict]) -> Path:
    set_dir = root / folder
    set_dir.mkdir(parents=True)
    (set_dir / "questions.json").write_text(json.dumps({"askwright": 1, "id": set_id, "title": "T",
                                                        "questions": questions}))
    return set_dir


def answer(set_dir: Path, set_id: str, record: dict) -> None:
    AnswersFile(set_dir, set_id).update(lambda doc, now: put_record(doc, record, now), NOW)


@pytest.fixture
def bridge_config(tmp_path: Path, store_backend: str) -> Path:
    root = tmp_path / "sets"
    # "release": six questions covering every column.
    release = write_set(root, "release", "release", [
        text_q("a"), text_q("b"), text_q("c"), text_q("d", rev=2), text_q("e"), text_q("f", status="closed"),
        text_q("g"),
    ])
    answer(release, "release", {"qid": "a", "text": "yes", "q_rev": 1})            # answered
    answer(release, "release", {"qid": "b", "choice": "unsure", "q_rev": 1})       # unsure
    answer(release, "release", {"qid": "c", "note": "see the log", "q_rev": 1})    # note only
    answer(release, "release", {"qid": "d", "text": "old", "q_rev": 1})            # answered, stale (now rev 2)
    answer(release, "release", {"qid": "f", "text": "done", "q_rev": 1})           # answered, closed since
    # e and g: open, nothing recorded -> pending
    write_set(root, "fresh", "fresh", [text_q("x")])
    broken = root / "broken"
    broken.mkdir()
    (broken / "questions.json").write_text("{ not json")

    store = Store(tmp_path / "bridge.sqlite")
    for event_id, set_id, qid, rev in [("$1", "release", "a", 1), ("$2", "release", "b", 1), ("$3", "release", "d", 1),
                                       ("$4", "release", "d", 2), ("$5", "fresh", "x", 1)]:
        content = {"elicitation_id": f"elc{event_id}", "question": {"id": qid, "rev": rev, "title": qid}}
        with store.transaction():
            store.record_posted(RecordedQuestion(event_id, "!r", set_id, content), set_dir=str(root / set_id),
                                posted_at=1)
    store.close()

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:8008"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": "./sets"}, "rooms": {"default": "!r"}, "store": {"path": "./bridge.sqlite"},
    }))
    return config


def by_set(output: str) -> dict[str, dict]:
    data = json.loads(output)
    assert data["ok"] is True
    return {row["set_id"]: row for row in data["sets"]}


def test_json_counts_every_column(bridge_config, capsys):
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    rows = by_set(capsys.readouterr().out)
    release = rows["release"]
    assert {k: release[k] for k in ("posted", "open", "answered", "unsure", "notes", "pending", "expired", "stale")} == \
        {"posted": 3, "open": 6, "answered": 3, "unsure": 1, "notes": 1, "pending": 2, "expired": 0, "stale": 1}
    assert release["problem"] is None
    assert rows["fresh"]["posted"] == 1 and rows["fresh"]["pending"] == 1 and rows["fresh"]["answered"] == 0


def test_a_set_that_cant_be_read_is_a_row_saying_why_and_the_exit_is_still_0(bridge_config, capsys):
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    broken = by_set(capsys.readouterr().out)["broken"]
    assert "not" in broken["problem"] and broken["answered"] == 0


def test_the_table_has_a_line_per_set(bridge_config, capsys):
    assert main(["status", "-c", str(bridge_config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SET", "POSTED", "OPEN", "ANSWERED", "UNSURE", "NOTES", "PENDING", "EXPIRED", "STALE"]
    cells = {line.split()[0]: line.split() for line in lines[1:]}
    assert cells["release"][1:] == ["3", "6", "3", "1", "1", "2", "0", "1"]
    assert cells["broken"][1:9] == ["0", "-", "-", "-", "-", "-", "-", "-"] and "(" in lines[1 + list(cells).index("broken")]


def test_the_counts_agree_with_read(bridge_config, capsys):
    # status is computed from read's own view: the same answered count as read's "count" minus unsure/notes.
    assert main(["read", str(bridge_config.parent / "sets" / "release")]) == 0
    view = json.loads(capsys.readouterr().out)
    states = [a["state"] for a in view["answers"]]
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    release = by_set(capsys.readouterr().out)["release"]
    assert release["answered"] == states.count("answered") and release["unsure"] == states.count("unsure")


@pytest.mark.sqlite_only
def test_without_a_store_nothing_is_posted_and_none_is_created(bridge_config, capsys):
    (bridge_config.parent / "bridge.sqlite").unlink()
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    printed = capsys.readouterr()
    assert by_set(printed.out)["release"]["posted"] == 0
    assert not (bridge_config.parent / "bridge.sqlite").exists()
    # A mistyped store.path looks the same: said, not left for the operator to guess.
    assert "no store at" in printed.err and "store.path" in printed.err


@pytest.mark.sqlite_only
def test_status_does_not_migrate_or_write_the_store(bridge_config, capsys):
    store_path = bridge_config.parent / "bridge.sqlite"
    before = store_path.read_bytes()
    assert main(["status", "-c", str(bridge_config)]) == 0
    assert store_path.read_bytes() == before


def test_an_unusable_config_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text("homeserver: [")
    assert main(["status", "-c", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


def test_a_store_from_a_newer_bridge_exits_2(bridge_config, capsys):
    store = Store(bridge_config.parent / "bridge.sqlite")
    store.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store.close()
    assert main(["status", "-c", str(bridge_config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "newer askwright-bridge" in err


def test_count_view_and_table_are_pure():
    view = {"answers": [
        {"status": "open", "state": "answered", "stale": False},
        {"status": "open", "state": "unanswered", "stale": False},
        {"status": "closed", "state": "unanswered", "stale": False},  # not pending: closed
        {"status": "removed", "state": "answered", "stale": None},
    ]}
    assert count_view(view) == {"open": 2, "answered": 2, "unsure": 0, "notes": 0, "pending": 1, "expired": 0, "stale": 0}
    assert format_table([]) == "no sets\n"
    table = format_table([SetStatus("s", "/s", posted=12, answered=3)])
    assert table.splitlines()[1].split() == ["s", "12", "0", "3", "0", "0", "0", "0", "0"]


def test_a_rev_lower_than_one_posted_is_a_warning_under_the_sets_row(bridge_config, capsys):
    root = bridge_config.parent / "sets"
    store = Store(bridge_config.parent / "bridge.sqlite")
    content = {"elicitation_id": "elc$6", "question": {"id": "x", "rev": 3, "title": "x"}}
    with store.transaction():  # "fresh"/x was posted at rev 3; the file says rev 1 (restored from a backup)
        store.record_posted(RecordedQuestion("$6", "!r", "fresh", content), set_dir=str(root / "fresh"), posted_at=2)
    store.close()
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    rows = by_set(capsys.readouterr().out)
    assert len(rows["fresh"]["warnings"]) == 1 and "rev went back from 3 to 1" in rows["fresh"]["warnings"][0]
    assert rows["release"]["warnings"] == [] and rows["fresh"]["problem"] is None
    assert main(["status", "-c", str(bridge_config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    below = lines[[line.split()[0] for line in lines].index("fresh") + 1]
    assert below.startswith("  warning: questions[x].rev: rev went back from 3 to 1")


def test_json_says_whether_the_bridge_answered_at_health(bridge_config, capsys):
    """A bridge stopped, or frozen (SIGSTOP), answers nothing: --json says so,
    as the table does, instead of an empty list of tasks that reads as none."""
    from helpers.agents import free_port  # a port nothing listens on

    config = yaml.safe_load(bridge_config.read_text())
    config["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}
    bridge_config.write_text(yaml.safe_dump(config))
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bridge_answered"] is False and out["tasks"] == {}
    assert main(["status", "-c", str(bridge_config)]) == 0
    assert "the bridge did not answer at /health" in capsys.readouterr().out


def test_status_audit_and_lint_run_without_the_bridges_tokens(bridge_config, tmp_path, capsys, monkeypatch):
    # An operator reading how sets stand, or exporting the log, from a copy of
    # the config that holds no secrets (they live in the service's environment).
    for var in ("ASKWRIGHT_BRIDGE_ACCESS_TOKEN", "ASKWRIGHT_BRIDGE_AGENT_PLANNER_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    raw = yaml.safe_load(bridge_config.read_text())
    del raw["bot"]["access_token"]
    raw["agents"] = {"planner": {"webhook_url": "https://hooks.example/in"}}
    bridge_config.write_text(yaml.safe_dump(raw))

    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    assert by_set(capsys.readouterr().out)["release"]["answered"] == 3
    main(["lint", "-c", str(bridge_config), str(tmp_path / "sets" / "fresh")])
    said = capsys.readouterr()
    assert "fresh: ok" in said.out and "config" not in said.out + said.err
    main(["audit", "export", "-c", str(bridge_config), "-o", str(tmp_path / "exported")])
    assert "the store holds no answer log yet" in capsys.readouterr().err  # past the config, into the store
    # The bridge itself still refuses to start without them, naming what is missing.
    assert main(["run", "-c", str(bridge_config)]) == 2
    assert "bot: needs access_token or password" in capsys.readouterr().err


def test_a_sets_root_status_cannot_read_is_a_row_saying_why_not_no_sets(bridge_config, tmp_path, capsys):
    # A mistyped sets.root (or one the operator's user can't list) printed
    # "No sets" with exit 0: every set left out without a word.
    raw = yaml.safe_load(bridge_config.read_text())
    raw["sets"]["root"] = "./sets-mistyped"
    bridge_config.write_text(yaml.safe_dump(raw))
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sets"]
    assert [(row["set_dir"], row["problem"]) for row in rows] == [
        (str(tmp_path / "sets-mistyped"), "can't be read: No such file or directory")]


def test_a_set_the_bridge_skips_for_failing_lint_is_a_row_saying_so(bridge_config, tmp_path, capsys):
    """The bridge skips a set that fails lint (said in its log); status showed
    it as a healthy set with its questions pending, and its agent's wait hung
    with no word."""
    broken = text_q("x")
    del broken["why"]
    write_set(tmp_path / "sets", "skipped", "skipped", [broken])
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    rows = by_set(capsys.readouterr().out)
    assert rows["skipped"]["warnings"][0].startswith("not posted: questions[x].why")
    assert rows["release"]["warnings"] == []  # (a set that passes: nothing said)


def test_a_finished_set_the_bridge_still_takes_is_no_skipped_one(bridge_config, tmp_path, capsys):
    """Every question closed: lint's "one must be open" is no reason the
    bridge skips it (it closes them in the room); status must not say so."""
    write_set(tmp_path / "sets", "finished", "finished", [text_q("x", status="closed")])
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    assert by_set(capsys.readouterr().out)["finished"]["warnings"] == []


def test_a_set_whose_questions_file_was_deleted_is_a_row_saying_its_questions_stay_open(bridge_config, capsys):
    """Its folder is still there, so its questions stay open and take
    answers; status said "no sets" of it, as if nothing were open."""
    (bridge_config.parent / "sets" / "fresh" / "questions.json").unlink()
    assert main(["status", "-c", str(bridge_config), "--json"]) == 0
    fresh = by_set(capsys.readouterr().out)["fresh"]
    assert fresh["posted"] == 1
    assert "no questions.json" in fresh["problem"] and "its 1 posted questions stay open" in fresh["problem"]


def test_json_held_back_has_one_shape_with_or_without_a_store(bridge_config, tmp_path, capsys):
    # Before the bridge's first run it had only sets, events and notices: a
    # script reading held_back["waiting"] raised; webhooks was a bare pair.
    main(["status", "-c", str(bridge_config), "--json"])
    with_store = json.loads(capsys.readouterr().out)["held_back"]
    raw = yaml.safe_load(bridge_config.read_text())
    raw["store"]["path"] = str(tmp_path / "not-yet.sqlite")
    bridge_config.write_text(yaml.safe_dump(raw))
    main(["status", "-c", str(bridge_config), "--json"])
    without = json.loads(capsys.readouterr().out)["held_back"]
    assert set(without) == set(with_store) == {"sets", "events", "notices", "waiting", "not_posted", "webhooks"}
    assert without["webhooks"] == with_store["webhooks"] == {"pending": 0, "oldest_ms": None}
