"""A rev lower than one the bridge posted is a lint warning: the pure rule,
and ``lint -c CONFIG``, which reads the posted revs from the bridge's store."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.cli import main
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.lint import lint
from bridge.questionset.lint.posted import revs_went_back
from bridge.questionset.media import LocalFilesystem
from bridge.service.storage.store import Store

SET = {
    "askwright": 1, "id": "tiny", "title": "Tiny",
    "questions": [
        {"id": "lunch", "kind": "choice", "rev": 1, "title": "Lunch",
         "question": "Where should the team have lunch on Friday?", "why": "The booking closes on Thursday.",
         "options": [{"id": "pizza", "label": "The pizza place"}, {"id": "thai", "label": "The Thai place"}],
         "guess": {"option": "thai", "why": "Last time was pizza.", "confidence": "low"}},
        {"id": "dinner", "kind": "text", "title": "Dinner", "question": "Where should we have dinner?",
         "why": "Someone has to book.", "guess": {"text": "the usual", "why": "It is close.", "confidence": "low"}},
    ],
}


def findings(raw: dict[str, Any], posted: dict[str, int] | None, tmp_path: Path) -> list[tuple[str, str]]:
    result = lint(raw, LocalFilesystem(str(tmp_path)), posted_revs=posted)
    assert result.errors == []
    return [(f.where, f.message) for f in result.warnings]


def test_a_rev_below_the_highest_posted_is_one_warning_at_that_rev(tmp_path: Path) -> None:
    found = findings(SET, {"lunch": 3, "dinner": 1}, tmp_path)
    assert len(found) == 1
    where, message = found[0]
    assert where == "questions[lunch].rev" and message.startswith("rev went back from 3 to 1")


def test_no_rev_is_rev_1_and_counts_as_going_back(tmp_path: Path) -> None:
    assert [w for w, _m in findings(SET, {"dinner": 2}, tmp_path)] == ["questions[dinner].rev"]


@pytest.mark.parametrize("posted", [None, {}, {"lunch": 1}, {"other": 9}])
def test_nothing_posted_or_the_same_rev_or_higher_is_no_warning(tmp_path: Path, posted) -> None:
    raised = copy.deepcopy(SET)
    assert findings(raised, posted, tmp_path) == []
    raised["questions"][0]["rev"] = 4
    assert findings(raised, {"lunch": 3}, tmp_path) == []


def test_a_closed_question_is_not_posted_again_so_it_is_no_warning(tmp_path: Path) -> None:
    closed = copy.deepcopy(SET)
    closed["questions"][0]["status"] = "closed"
    assert findings(closed, {"lunch": 3}, tmp_path) == []


def test_the_rule_alone_on_a_raw_set_says_the_same(tmp_path: Path) -> None:
    alone = revs_went_back(SET, {"lunch": 3})
    assert [(f.where, f.message) for f in alone] == findings(SET, {"lunch": 3}, tmp_path)
    assert revs_went_back({"questions": "not a list"}, {"lunch": 3}) == []


def bridge_config(tmp_path: Path, posted: list[tuple[str, str, int]]) -> Path:
    """A config whose store recorded ``posted`` (folder name, question id, rev)."""
    root = tmp_path / "sets"
    store = Store(tmp_path / "bridge.sqlite")
    for n, (folder, qid, rev) in enumerate(posted):
        content = {"elicitation_id": f"elc{n}", "question": {"id": qid, "rev": rev, "title": qid}}
        with store.transaction():
            store.record_posted(RecordedQuestion(f"${n}", "!r", "tiny", content),
                                set_dir=str((root / folder).resolve()), posted_at=n)
    store.close()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:8008"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": "./sets"}, "rooms": {"default": "!r"}, "store": {"path": "./bridge.sqlite"},
    }))
    return config


def write(folder: Path, raw: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "questions.json").write_text(json.dumps(raw))
    return folder


def test_lint_with_the_config_warns_of_a_rev_that_went_back_and_still_exits_0(tmp_path: Path, store_backend,
                                                                              capsys) -> None:
    # Posted rev 1, then rev 2 (the newest posting is rev 1 again: the highest counts).
    config = bridge_config(tmp_path, [("tiny", "lunch", 1), ("tiny", "lunch", 2), ("tiny", "lunch", 1)])
    folder = write(tmp_path / "sets" / "tiny", SET)
    assert main(["lint", "--no-probe", str(folder)]) == 0
    assert "no warnings" in capsys.readouterr().out  # without the store there is nothing to compare
    assert main(["lint", "--no-probe", "--json", "-c", str(config), str(folder)]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert [w["where"] for w in warnings] == ["questions[lunch].rev"]
    assert warnings[0]["message"].startswith("rev went back from 2 to 1")
    assert main(["lint", "--no-probe", "-c", str(config), str(tmp_path / "sets")]) == 0  # the whole root
    assert "rev went back from 2 to 1" in capsys.readouterr().out


def test_another_folders_postings_are_not_this_sets(tmp_path: Path, store_backend, capsys) -> None:
    config = bridge_config(tmp_path, [("elsewhere", "lunch", 5)])
    folder = write(tmp_path / "sets" / "tiny", SET)
    assert main(["lint", "--no-probe", "-c", str(config), str(folder)]) == 0
    assert "no warnings" in capsys.readouterr().out


@pytest.mark.sqlite_only
def test_lint_before_the_bridge_ever_ran_has_nothing_to_compare_and_creates_no_store(tmp_path: Path, capsys) -> None:
    config = bridge_config(tmp_path, [])
    (tmp_path / "bridge.sqlite").unlink()
    folder = write(tmp_path / "sets" / "tiny", SET)
    assert main(["lint", "--no-probe", "-c", str(config), str(folder)]) == 0
    assert not (tmp_path / "bridge.sqlite").exists()


def test_an_unusable_config_exits_2(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("homeserver: [")
    folder = write(tmp_path / "sets" / "tiny", SET)
    assert main(["lint", "--no-probe", "-c", str(config), str(folder)]) == 2
    assert str(config) in capsys.readouterr().err
