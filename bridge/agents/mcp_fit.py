"""A read view that fits in one MCP message.  Pure.

A tool's result goes out twice in its message (``structuredContent`` and the
same JSON as text, as the specification asks), and a long call's message is
one server-sent event, of which the Python SDK's client reads at most 1 MiB:
a ``wait`` on a set of 4,000 questions (a 1.8 MB view) failed in the client,
and the agent lost the answer it waited for.  A view past ``VIEW_BUDGET``
keeps its newest answers, says how many it left out (``omitted``) and where
the whole view is read (``resource``: ``resources/read`` answers whole, not as
an event).
"""

from __future__ import annotations

import json
from typing import Any

# The view's JSON at most: twice in the message, the text copy's quotes
# escaped, the JSON-RPC envelope: well under 1 MiB.
VIEW_BUDGET = 400 * 1024


def fit_view(view: dict[str, Any], resource: str, budget: int = VIEW_BUDGET) -> dict[str, Any]:
    """``view`` (a read view: its ``answers`` list) as it is when it fits,
    else with the entries that fit: answered ones before unanswered, the
    latest ``updated`` first, listed in the view's own order."""
    entries = view.get("answers")
    if not isinstance(entries, list) or len(_json(view)) <= budget:
        return view
    sizes = [len(_json(entry)) + 2 for entry in entries]
    room = budget - (len(_json({**view, "answers": []})) + 200)  # the view without entries, the note added
    ranked = sorted(range(len(entries)), key=lambda i: (entries[i].get("state") != "unanswered",
                                                        str(entries[i].get("updated") or "")), reverse=True)
    kept: set[int] = set()
    for index in ranked:
        if sizes[index] <= room:
            kept.add(index)
            room -= sizes[index]
    return {**view, "answers": [entry for i, entry in enumerate(entries) if i in kept],
            "omitted": len(entries) - len(kept), "resource": resource}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
