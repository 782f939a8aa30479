"""The set as a whole: its own fields, and what must hold across its open questions."""

from __future__ import annotations

from bridge.questionset.lint.access import blank, is_int, list_at, quote, str_at, value_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.guess import SINGLE_PICK_KINDS
from bridge.questionset.lint.identity import id_problem
from bridge.questionset.lint.unknown import check_unknown

MAX_OPEN = {"decide": 12, "study": 30}
FIRST_OPTION_GUESS_MIN = 3


def check_set(ctx: Context) -> None:
    raw = ctx.raw
    check_unknown(ctx, raw, "set", "")
    version = raw.get("askwright")
    if is_int(version) and version != 1:
        ctx.error("askwright", f"is {version}; this format is version 1, so set it to 1")
    set_id = str_at(raw, "id")
    if set_id is not None and (problem := id_problem(set_id)):
        ctx.error("id", f"the set id {problem}")
    title = str_at(raw, "title")
    if title is not None and blank(title):
        ctx.error("title", "the set needs a title: it is shown in the page's top bar")
    for i, root in enumerate(list_at(raw, "media_roots") or []):
        if isinstance(root, str) and ctx.fs.is_file(root):
            ctx.error(f"media_roots[{i}]", f"{quote(root)} is a file, not a folder; name the folder the media are in")
        elif isinstance(root, str) and not ctx.fs.is_dir(root):
            ctx.error(f"media_roots[{i}]", f"the folder {quote(root)} does not exist; create it or remove it from media_roots")


def check_across_questions(ctx: Context, questions: list[QuestionView]) -> None:
    open_questions = [q for q in questions if q.is_open]
    if isinstance(ctx.raw.get("questions"), list) and not open_questions:
        ctx.error("questions", "at least one question must be open")
    limit = MAX_OPEN[ctx.mode]
    if len(open_questions) > limit:
        ctx.warning("questions", f"{len(open_questions)} open questions; keep it to {limit} or split the set")
    _check_unique_among_open(ctx, open_questions, "title", "title")
    _check_unique_among_open(ctx, open_questions, "question", "question")
    _check_first_option_guesses(ctx, open_questions)


def _check_unique_among_open(ctx: Context, open_questions: list[QuestionView], key: str, noun: str) -> None:
    seen: dict[str, QuestionView] = {}
    for q in open_questions:
        value = str_at(q.raw, key)
        if value is None or not value.strip():
            continue
        norm = " ".join(value.split()).casefold()
        if norm in seen:
            other = seen[norm].id or "another question"
            ctx.error(f"{q.where}.{key}", f"the open question {quote(other)} has the same {noun}; make each {noun} distinct")
        else:
            seen[norm] = q


def _check_first_option_guesses(ctx: Context, open_questions: list[QuestionView]) -> None:
    # Read as: among the open questions whose guess names one option, there
    # are three or more and every one of them guesses its first option; a
    # pattern that teaches the person to pick the top answer.
    guessed = [q for q in open_questions if q.kind in SINGLE_PICK_KINDS and isinstance(str_at(value_at(q.raw, "guess"), "option"), str)]
    if len(guessed) < FIRST_OPTION_GUESS_MIN:
        return
    if all(q.option_ids and q.raw["guess"]["option"] == q.option_ids[0] for q in guessed):
        ctx.warning("questions", "every guess is the first option; put the options in an order that does not give the guess away")
