"""The posted quorum in the answer log's leaves (docs/audit.md): read once,
by ``audit_leaf.posted_quorum``, for the leaf and for what the bridge counts
(``RecordedQuestion.quorum``), and written in the bytes leaves always had."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from bridge.protocol.audit_leaf import build_leaf, canonical
from bridge.protocol.recorded import RecordedQuestion

POSTED = [
    None,
    {"required": 2, "veto": ["b", "a", "b", 3]},
    {"required": 1},
    {"required": True},
    {"required": 0},
    {"required": 2.0},
    {"required": 3, "veto": []},
    {"required": 2, "veto": None},
    {"required": 2, "veto": "ab"},
    {"required": 2, "veto": {"x": 1}},
    "2 of 3",
]


def _content(quorum: Any) -> dict[str, Any]:
    question: dict[str, Any] = {"id": "q", "rev": 1, "kind": "choice"}
    if quorum is not None:
        question["quorum"] = quorum
    return {"question": question, "body": "x"}


def _leaf(content: dict[str, Any]) -> dict[str, Any]:
    return build_leaf(outcome="accepted", set_id="s", room_id="!r", event_id="$e", sender="@a:hs", ts=1,
                      question=content, question_event_id="$q", record={"qid": "q", "state": "answered"})


def test_a_leaf_says_its_quorum_in_the_bytes_it_always_had() -> None:
    """The log's hashes never change: the veto as posted (its order, a
    duplicate), anything but an option id left out, no ``quorum`` at all
    without a readable one."""
    leaf = _leaf(_content({"required": 2, "veto": ["b", "a", "b", 3]}))
    assert canonical(leaf["question"]["quorum"]) == b'{"required":2,"veto":["b","a","b"]}'
    assert hashlib.sha256(canonical(leaf)).hexdigest() == \
        "36a1d2211a17c7c45bb78f1ebbc637dcab5a6e7ca4e634f0fb9b910ca74204d4"
    assert "quorum" not in _leaf(_content(None))["question"]
    assert "quorum" not in _leaf(_content({"required": True}))["question"]


@pytest.mark.parametrize("quorum", POSTED)
def test_what_the_bridge_counts_is_the_quorum_its_leaves_say(quorum: Any) -> None:
    """A veto posted as a string was read as its letters by the bridge and as
    no veto by its leaves: the log said it counted otherwise than it did."""
    content = _content(quorum)
    said = _leaf(content)["question"].get("quorum")
    counted = RecordedQuestion("$q", "!r", "s", content).quorum
    assert counted == (None if said is None else (said["required"], frozenset(said["veto"])))
