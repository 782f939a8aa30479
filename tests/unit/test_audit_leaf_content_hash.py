"""A question's content hash in the answer log's leaves (docs/audit.md) is
the sha256 of its RFC 8785 bytes, however often it is asked for: the hash
the leaf builder keeps for a content is always the one computed afresh."""

from __future__ import annotations

import copy
import hashlib
import json

import rfc8785

from bridge.protocol import audit_leaf


def _fresh(content: dict) -> str:
    try:
        return hashlib.sha256(rfc8785.dumps(content)).hexdigest()
    except Exception:  # noqa: BLE001 - what JCS can't express is hashed over sorted compact JSON
        return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False).encode()).hexdigest()


CONTENTS = [
    {"question": {"id": "q1", "rev": 1, "title": "Which take?"}, "set": {"id": "s"}},
    {"set": {"id": "s"}, "question": {"title": "Which take?", "rev": 1, "id": "q1"}},  # other key order
    {"question": {"id": "q1", "rev": 2, "title": "Which take?"}, "set": {"id": "s"}},
    {"question": {"id": "q1", "rev": 1, "title": "Quelle prise ? \u00e9\U0001f3ac \u2028"}, "set": {"id": "s"}},
    {"question": {"id": "q1", "rev": 1, "n": 2 ** 60}, "set": {"id": "s"}},  # past JCS's integers: the fallback
    {"question": {"id": "q1", "rev": 1, "n": 2 ** 60, "t": 1.5}, "set": {"id": "s"}},
    {"question": {"id": "q1", "rev": True}, "set": {"id": "s"}},
    {"question": {"id": "q1", "rev": 1.0}, "set": {"id": "s"}},
]


def test_the_content_hash_is_the_one_computed_afresh_every_time() -> None:
    for _ in range(3):
        for content in CONTENTS:
            assert audit_leaf.content_sha256(copy.deepcopy(content)) == _fresh(content)
    assert audit_leaf.content_sha256(CONTENTS[0]) == audit_leaf.content_sha256(CONTENTS[1])
    assert len({audit_leaf.content_sha256(c) for c in CONTENTS}) == len(CONTENTS) - 1


def test_a_content_changed_in_place_gets_its_new_hash() -> None:
    content = copy.deepcopy(CONTENTS[0])
    before = audit_leaf.content_sha256(content)
    content["question"]["title"] = "Which take, then?"
    assert audit_leaf.content_sha256(content) == _fresh(content) != before
