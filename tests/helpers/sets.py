"""Question sets for integration tests."""

from __future__ import annotations

import copy
from typing import Any

SUBJECT = {"id": "8f9a0d0e-4b2a-4c1e-9c55-1a2b3c4d5e6f",
           "digest": "0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"}


def _guess(**fields: Any) -> dict[str, Any]:
    return {**fields, "why": "It is what the last release did.", "confidence": "high"}


def all_kinds_set(set_id: str = "kinds") -> dict[str, Any]:
    """One question of each of the seven kinds, plus a subject-bound approval."""
    return copy.deepcopy({
        "askwright": 1,
        "id": set_id,
        "title": "Release decisions",
        "questions": [
            {"id": "branch", "kind": "choice", "title": "Release branch",
             "question": "Which branch should the release be cut from?",
             "why": "The cut decides which fixes ship.",
             "options": [{"id": "main", "label": "The main branch"},
                         {"id": "stable", "label": "The stable branch", "consequence": "Two fixes wait a month."}],
             "guess": _guess(option="main")},
            {"id": "platforms", "kind": "multi", "title": "Platforms",
             "question": "Which platforms should get builds this time?",
             "why": "Each platform costs an hour of CI.",
             "options": [{"id": "linux", "label": "Linux"}, {"id": "mac", "label": "macOS"},
                         {"id": "win", "label": "Windows"}],
             "guess": _guess(options=["linux", "mac"])},
            {"id": "takes", "kind": "compare", "title": "Intro take",
             "question": "Which take of the intro should go in the video?",
             "why": "Only one intro fits.",
             "look_for": ["Whether the voice stays level from 1.0 s"],
             "sides": {"left": "t2", "right": "t5", "randomized": True},
             "options": [{"id": "t2", "label": "Take 2"}, {"id": "t5", "label": "Take 5"}],
             "guess": _guess(option="t5")},
            {"id": "order", "kind": "rank", "title": "Fix order",
             "question": "In what order should the three bugs be fixed?",
             "why": "One person works through them in turn.",
             "options": [{"id": "crash", "label": "The crash on start"}, {"id": "leak", "label": "The memory leak"},
                         {"id": "typo", "label": "The typo in help"}],
             "guess": _guess(order=["crash", "leak", "typo"])},
            {"id": "name", "kind": "text", "title": "Release name",
             "question": "What should this release be called?",
             "why": "The name goes on the download page.",
             "guess": _guess(text="Aurora")},
            {"id": "risk", "kind": "scale", "title": "Risk",
             "question": "How risky does this release look to you?",
             "why": "A risky release gets a longer beta.",
             "options": [{"id": "low", "label": "Hardly risky"}, {"id": "mid", "label": "Somewhat risky"},
                         {"id": "high", "label": "Very risky"}],
             "guess": _guess(option="low")},
            {"id": "ship", "kind": "confirm", "title": "Ship it",
             "question": "Should the release go out on Friday?",
             "why": "Friday releases need someone on call.",
             "options": [{"id": "go", "label": "Ship on Friday"}, {"id": "wait", "label": "Wait until Monday"}],
             "guess": _guess(option="wait")},
            {"id": "approve", "kind": "confirm", "title": "Approve the deploy",
             "question": "May the agent deploy this exact build?",
             "why": "A deploy needs a person's approval.",
             "subject": dict(SUBJECT),
             "options": [{"id": "approve", "label": "Approve the deploy"}, {"id": "deny", "label": "Deny the deploy"}],
             "guess": _guess(option="approve")},
        ],
    })


# One answer for each question of ``all_kinds_set``: qid -> question.answer.v2 fields.
ALL_KINDS_PICKS: dict[str, dict[str, Any]] = {
    "branch": dict(option_id="stable"),
    "platforms": dict(text="linux, win"),
    "takes": dict(option_id="t2"),
    "order": dict(text="leak, crash, typo"),
    "name": dict(text="Borealis"),
    "risk": dict(option_id="other", text="Depends on the migration"),
    "ship": dict(option_id="unsure"),
    "approve": dict(option_id="approve"),
}


def check_all_kinds_read(view: dict[str, Any]) -> None:
    """``read``'s view after ``ALL_KINDS_PICKS`` landed once each."""
    got = {a["qid"]: a for a in view["answers"]}
    assert view["ok"] is True and view["count"] == len(ALL_KINDS_PICKS)
    assert (got["branch"]["choice"], got["branch"]["label"]) == ("stable", "The stable branch")
    assert got["branch"]["matched_guess"] is False
    assert got["platforms"]["choices"] == ["linux", "win"]
    assert (got["takes"]["choice"], got["takes"]["side"]) == ("t2", "left")
    assert got["order"]["order"] == ["leak", "crash", "typo"]
    assert got["name"]["text"] == "Borealis"
    assert (got["risk"]["choice"], got["risk"]["note"]) == ("other", "Depends on the migration")
    assert got["ship"]["state"] == "unsure"
    assert (got["approve"]["choice"], got["approve"]["matched_guess"]) == ("approve", True)
    # What the person approved, as they answered it; other kinds are bound to nothing.
    assert got["approve"]["subject"] == SUBJECT
    assert all("subject" not in answer for qid, answer in got.items() if qid != "approve")
    for answer in got.values():
        assert answer["q_rev"] == 1 and answer["stale"] is False and answer["rev"] == 1
