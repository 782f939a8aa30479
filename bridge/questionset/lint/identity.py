"""Ids, and a question's links to other questions by id: show_if, status, rev and supersedes."""

from __future__ import annotations

import re

from bridge.questionset.lint.access import dict_at, is_int, list_at, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_REV = 2**53 - 1
SUPERSEDES_PATTERN = re.compile(r"(?P<id>[^@]+)(?:@(?P<rev>[1-9][0-9]*))?")


def id_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if value.startswith("_"):
        return "must not start with _ (such ids are reserved); start it with a letter or digit"
    if len(value) > 64:
        return f"is {len(value)} characters long; shorten it to 64 at most"
    if not ID_PATTERN.fullmatch(value):
        return "may hold only letters, digits, _, . and -, and must start with a letter or digit"
    return None


def check_question_id(ctx: Context, q: QuestionView, by_id: dict[str, QuestionView]) -> None:
    if q.id is None:
        return
    if problem := id_problem(q.id):
        ctx.error(f"{q.where}.id", f"the question id {problem}")
    elif by_id.get(q.id) is not q:
        ctx.error(f"{q.where}.id", f"another question already has the id {quote(q.id)}; give each question its own id")


def check_show_if(ctx: Context, q: QuestionView, by_id: dict[str, QuestionView]) -> None:
    show_if = dict_at(q.raw, "show_if")
    if show_if is None:
        return
    where = f"{q.where}.show_if"
    check_unknown(ctx, show_if, "show_if", where)
    target_id = str_at(show_if, "question")
    if target_id is None:
        return
    if target_id == q.id:
        ctx.error(f"{where}.question", "a question can't depend on its own answer; name another question")
        return
    if (loop := _show_if_loop(q.id, by_id)) is not None:
        ctx.error(f"{where}.question", f"the questions {' -> '.join(quote(i) for i in loop)} each wait for the next "
                                       "one's answer: none of them could ever be shown")
        return
    target = by_id.get(target_id)
    if target is None:
        ctx.error(f"{where}.question", f"{quote(target_id)} is not a question in this set")
        return
    picks = list_at(show_if, "option")
    if picks is None or not all(isinstance(p, str) for p in picks):
        return
    if not picks:
        ctx.error(f"{where}.option", f"name at least one option of {quote(target_id)} that shows this question")
    elif unknown := [p for p in picks if p not in target.option_ids]:
        ctx.error(f"{where}.option", f"{', '.join(quote(p) for p in unknown)} not among the option ids of {quote(target_id)}")


def _show_if_loop(start: str | None, by_id: dict[str, QuestionView]) -> list[str] | None:
    """The ids of the show_if chain from ``start`` back to it, when it comes back."""
    chain: list[str] = []
    current = start
    while current is not None and current not in chain:
        chain.append(current)
        show_if = dict_at(by_id[current].raw, "show_if") if current in by_id else None
        current = str_at(show_if, "question") if show_if is not None else None
    return [*chain, start] if current == start and start is not None and len(chain) > 1 else None


def check_status(ctx: Context, q: QuestionView, by_id: dict[str, QuestionView]) -> None:
    status = q.raw.get("status")
    if status == "superseded":
        by = q.raw.get("superseded_by")
        if by is None or (isinstance(by, str) and not by.strip()):
            ctx.error(f"{q.where}.superseded_by", "a superseded question needs superseded_by: the id of the question that replaces it")
        elif isinstance(by, str) and (by not in by_id or by == q.id):
            ctx.error(f"{q.where}.superseded_by", f"{quote(by)} must name another question in this set")
    elif status == "withdrawn":
        reason = q.raw.get("reason")
        if reason is None or (isinstance(reason, str) and not reason.strip()):
            ctx.error(f"{q.where}.reason", "a withdrawn question needs a reason")


def check_rev_and_supersedes(ctx: Context, q: QuestionView) -> None:
    rev = q.raw.get("rev")
    if is_int(rev) and rev < 1:
        ctx.error(f"{q.where}.rev", f"rev is {rev}; revisions start at 1")
    elif is_int(rev) and rev > MAX_REV:
        # Matrix homeservers refuse integers past 2^53 - 1 in events (PROTOCOL 2).
        ctx.error(f"{q.where}.rev", f"rev is {rev}; a rev can be at most {MAX_REV}")
    supersedes = str_at(q.raw, "supersedes")
    if supersedes is None:
        return
    match = SUPERSEDES_PATTERN.fullmatch(supersedes)
    if match is None or id_problem(match["id"]) is not None:
        ctx.error(f"{q.where}.supersedes", 'write it as "<old id>" or "<old id>@<rev>" (rev a whole number from 1)')
    elif match["id"] == q.id:
        # Decided here: a question replaces another one; its own new revision just raises rev.
        ctx.error(f"{q.where}.supersedes", "a question can't supersede itself; raise its rev instead")
