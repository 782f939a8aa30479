"""The set against what the bridge already posted: a rev lower than one
posted, and a posted question changed without a new rev.

The revs posted come in as plain values (question id -> the highest rev the
bridge posted of it, from its store); the shell that has a store reads them,
so this stays pure and ``lint`` without a store simply has none to compare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.questionset.lint.access import is_int
from bridge.questionset.lint.context import Context, QuestionView, question_views
from bridge.questionset.load import Finding

DEFAULT_REV = 1  # the format's default when a question has no rev


def rev_went_back(posted: int, rev: int) -> str:
    """The words for it, shared with the poster's log line."""
    return (f"rev went back from {posted} to {rev}: the bridge posts it as a new posting (answers to rev "
            f"{posted} stay with theirs); to change the question, raise rev above {posted} instead")


def went_back(posted_revs: Mapping[str, int], qid: str | None, rev: object, is_open: bool) -> int | None:
    """The rev posted that ``rev`` is lower than, or None.  Only an open
    question is posted again; a closed one only closes its postings."""
    if qid is None or not is_open:
        return None
    rev = DEFAULT_REV if rev is None else rev
    posted = posted_revs.get(qid)
    if not is_int(rev) or rev < 1 or posted is None or rev >= posted:  # rev < 1 is an error already
        return None
    return posted


def check_posted_rev(ctx: Context, q: QuestionView) -> None:
    if (finding := _finding(ctx.posted_revs, q)) is not None:
        ctx.warnings.append(finding)


def revs_went_back(raw: dict[str, Any], posted_revs: Mapping[str, int]) -> list[Finding]:
    """This rule alone over a parsed questions.json (``status`` shows it
    without linting the rest of the set)."""
    return [f for f in (_finding(posted_revs, q) for q in question_views(raw)) if f is not None]


def _finding(posted_revs: Mapping[str, int], q: QuestionView) -> Finding | None:
    rev = q.raw.get("rev", DEFAULT_REV)
    posted = went_back(posted_revs, q.id, rev, q.is_open)
    # A warning: the bridge copes (a posting of its own), but the people
    # answering see an older text come back under an older number.
    return Finding(f"{q.where}.rev", rev_went_back(posted, rev)) if posted is not None else None


# What people are shown of a question: a change to any of it, with the rev
# left as posted, reaches nobody (the bridge posts a rev once).
_SHOWN = ("kind", "title", "question", "why", "hint", "options", "media", "show_if", "look_for", "sides")


def changed_unposted(raw: dict[str, Any], before: dict[str, Any] | None,
                     posted_revs: Mapping[str, int]) -> list[Finding]:
    """Questions ``raw`` changes from ``before`` (the set as it was) in what
    people see, at the rev the bridge has posted: the room keeps the posted
    words and its answers are to them, while ``read`` shows the new ones."""
    if not isinstance(before, dict):
        return []
    earlier = {view.id: view.raw for view in question_views(before) if view.id is not None}
    found = []
    for view in question_views(raw):
        old = earlier.pop(view.id, None) if view.id is not None else None
        rev = view.raw.get("rev", DEFAULT_REV)
        if old is None or not view.is_open or not is_int(rev) or posted_revs.get(view.id) != rev \
                or old.get("rev", DEFAULT_REV) != rev:
            continue
        changed = [name for name in _SHOWN if old.get(name) != view.raw.get(name)]
        if changed:
            found.append(Finding(f"{view.where}.rev", f"{', '.join(changed)} changed, but rev is still {rev}, "
                                 f"which the bridge has posted: people see and answer the posted question, and "
                                 f"read shows their answers under the new words; raise rev to {rev + 1} to ask "
                                 "this one"))
    return found
