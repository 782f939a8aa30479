"""A set an agent sent through the HTTP API or MCP names media only inside
its own folder; on a real disk, each way out (a media root elsewhere, an
absolute src, .., a symlink) is an error that says why, and the same set
written by a local agent is not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.agents.errors import LintFailed
from bridge.agents.owner import OWNER_FILE
from bridge.agents.sets import AgentSets
from bridge.questionset.lint import lint
from bridge.questionset.media import LocalFilesystem

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


def shot_question(src: str) -> dict:
    return {"id": "shot", "kind": "confirm", "title": "Screenshot", "question": "Does the new screen look right?",
            "why": "It ships tomorrow.", "look_for": ["Whether the buttons line up"],
            "options": [{"id": "yes", "label": "It looks right"}, {"id": "no", "label": "Something is off"}],
            "guess": {"option": "yes", "why": "The layout tests pass.", "confidence": "low"},
            "media": [{"src": src, "alt": "the new screen"}]}


def a_set(src: str, **extra) -> dict:
    return {"askwright": 1, "id": "mine", "title": "Screens", "questions": [shot_question(src)], **extra}


@pytest.fixture
def disk(tmp_path: Path) -> dict[str, Path]:
    """Two sets under one root: ``other`` holds a person's screenshot; ``mine`` is the agent's."""
    theirs = tmp_path / "other" / "attachments"
    theirs.mkdir(parents=True)
    (theirs / "alice-1.png").write_bytes(PNG)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "own.png").write_bytes(PNG)
    return {"root": tmp_path, "mine": mine, "theirs": theirs}


def forms(disk: dict[str, Path]) -> dict[str, tuple[dict, str]]:
    """Each way out of the folder: (the set, where the finding is)."""
    mine, theirs = disk["mine"], disk["theirs"]
    os.symlink(theirs, mine / "shots")
    os.symlink(theirs / "alice-1.png", mine / "linked.png")
    return {
        "a media root outside": (a_set("alice-1.png", media_roots=[str(theirs)]), "media_roots[0]"),
        "a media root climbing with ..": (a_set("alice-1.png", media_roots=["../other/attachments"]), "media_roots[0]"),
        "a media root through a symlink": (a_set("alice-1.png", media_roots=["shots"]), "media_roots[0]"),
        "an absolute src": (a_set(str(mine / "own.png")), "questions[shot].media[0].src"),
        "a src climbing with ..": (a_set("../mine/own.png"), "questions[shot].media[0].src"),
        "a src through a symlink": (a_set("linked.png", media_roots=[str(theirs)]), "questions[shot].media[0].src"),
    }


def test_each_way_out_is_an_error_for_an_api_set_and_not_for_a_local_one(disk):
    fs = LocalFilesystem(str(disk["mine"]))
    for name, (raw, where) in forms(disk).items():
        assert lint(raw, fs).ok, f"{name}: a local agent may name it"
        result = lint(raw, fs, confined=True)
        found = {f.where: f.message for f in result.errors}
        assert where in found, f"{name}: {found}"
        assert "only from inside its own folder" in found[where] and "upload" in found[where], found[where]


def test_media_inside_its_own_folder_is_fine_for_an_api_set(disk):
    (disk["mine"] / "takes").mkdir()
    (disk["mine"] / "takes" / "a.png").write_bytes(PNG)
    fs = LocalFilesystem(str(disk["mine"]))
    assert lint(a_set("own.png"), fs, confined=True).ok
    assert lint(a_set("a.png", media_roots=["takes"]), fs, confined=True).ok
    assert lint(a_set("takes/a.png"), fs, confined=True).ok


def test_a_background_file_follows_the_same_rule(disk):
    raw = a_set("own.png")
    raw["questions"][0]["one_pager"] = [{"type": "image", "src": str(disk["theirs"] / "alice-1.png")}]
    fs = LocalFilesystem(str(disk["mine"]))
    assert [f.where for f in lint(raw, fs, confined=True).errors] == ["questions[shot].one_pager[0].src"]


def test_the_service_refuses_each_form_and_writes_nothing(disk):
    sets = AgentSets(disk["root"])
    (disk["mine"] / OWNER_FILE).write_text(json.dumps({"agent": "planner", "callbacks": []}))  # as an upload leaves it
    for name, (raw, where) in forms(disk).items():
        with pytest.raises(LintFailed) as caught:
            sets.ask("planner", "mine", raw)
        assert where in [f["where"] for f in caught.value.findings], name
    assert not (disk["mine"] / "questions.json").exists()


def test_lint_of_a_set_the_api_wrote_says_why(disk):
    mine = disk["mine"]
    (mine / "questions.json").write_text(json.dumps(a_set("alice-1.png", media_roots=[str(disk["theirs"])])))
    command = [sys.executable, "-m", "bridge", "lint", str(mine), "--json", "--no-probe"]
    local = subprocess.run(command, capture_output=True, text=True)
    assert local.returncode == 0, local.stdout  # a local agent's set: its roots are its own business
    (mine / OWNER_FILE).write_text(json.dumps({"agent": "planner", "callbacks": []}))
    remote = subprocess.run(command, capture_output=True, text=True)
    assert remote.returncode == 1
    errors = json.loads(remote.stdout)["errors"]
    assert errors[0]["where"] == "media_roots[0]" and "HTTP API or MCP" in errors[0]["message"]
