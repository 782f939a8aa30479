"""The answer log after a storm (issue 32): one leaf per logged outcome, no
gap, none twice, and every checkpoint the room holds consistent with the last."""

from __future__ import annotations

import json
from typing import Any, Callable

from bridge.protocol import audit_verify, checkpoint as cp

STATE = "dev.superpipeline.answer_log.checkpoint"


def check_answer_log(rows: Callable[[str], list[tuple]], history: list[dict[str, Any]]) -> int:
    """``rows``: SQL -> rows of the store; ``history``: the room's events.  Returns the checkpoints checked."""
    leaves = rows("SELECT idx, seq, leaf FROM audit_leaf ORDER BY idx")
    assert [row[0] for row in leaves] == list(range(len(leaves))), "a gap in the answer log"
    logged = sorted(row[0] for row in rows("SELECT seq FROM answer_log"))
    recorded = sorted(row[1] for row in leaves if row[1] is not None and '"outcome":"set_aside"' not in row[2])
    assert recorded == logged, "a logged outcome without its leaf, or a leaf twice"
    # Outcomes with no answer-log row of their own (a close, a late vote's
    # withdrawal) are each logged once too.
    own = [json.loads(row[2]) for row in leaves if row[1] is None]
    keys_of = [(leaf["outcome"], leaf["event_id"], leaf["replaces"]) for leaf in own
               if leaf["outcome"] not in ("decided", "expired")]
    assert len(set(keys_of)) == len(keys_of), "an outcome without an answer-log row logged twice"
    # An approval's outcome is logged at each change (an earlier event read
    # late can undo a decision or make one): never the same one twice running.
    last: dict[str, str] = {}
    for leaf in own:
        if leaf["outcome"] in ("decided", "expired"):
            assert last.get(leaf["event_id"]) != leaf["outcome"], "an approval's outcome logged twice"
            last[leaf["event_id"]] = leaf["outcome"]
    states = [e["content"] for e in history if e.get("type") == STATE and isinstance(e.get("content"), dict)]
    assert states, "the room holds no checkpoint"
    keys = {content["key"] for content in states}
    assert len(keys) == 1, f"checkpoints signed with {len(keys)} keys"
    origin, public = cp.parse_verifier_key(keys.pop())
    verdict, _hashes, _latest = audit_verify.verify_log([row[2].encode() for row in leaves],
                                                        [content["checkpoint"] for content in states], origin, public)
    assert verdict.problems == [], verdict.problems[:5]
    return len(states)
