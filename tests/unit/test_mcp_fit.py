"""A read view too big for one MCP message keeps what fits (``mcp_fit``)."""

from __future__ import annotations

import json

from bridge.agents.mcp_fit import fit_view


def entry(qid: str, state: str, updated: str | None = None, words: int = 100) -> dict:
    return {"qid": qid, "state": state, "updated": updated, "title": "x" * words}


def test_a_view_that_fits_is_given_as_it_is():
    view = {"ok": True, "answers": [entry("a", "answered", "2026-01-01T00:00:00.000Z")]}
    assert fit_view(view, "askwright://sets/s/answers") is view


def test_a_view_too_big_keeps_answers_before_unanswered_and_the_latest_first_in_its_own_order():
    answered = [entry(f"a{n}", "answered", f"2026-01-01T00:00:{n:02d}.000Z", 1000) for n in range(10)]
    unanswered = [entry(f"u{n}", "unanswered", None, 1000) for n in range(50)]
    view = {"ok": True, "set": "s", "answers": unanswered[:25] + answered + unanswered[25:]}
    fitted = fit_view(view, "askwright://sets/s/answers", budget=8000)
    kept = [e["qid"] for e in fitted["answers"]]
    assert len(json.dumps(fitted)) <= 8000
    assert len(kept) >= 6 and kept == [f"a{n}" for n in range(10 - len(kept), 10)]  # the latest, in order
    assert fitted["omitted"] == 60 - len(kept) and fitted["resource"] == "askwright://sets/s/answers"
