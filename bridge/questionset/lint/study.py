"""Rules only a study set (a quiz) has: its kinds, topics, points, correct options and grading."""

from __future__ import annotations

import math
from typing import Any

from bridge.questionset.lint.access import blank, is_number, str_at
from bridge.questionset.lint.context import Context, QuestionView

STUDY_KINDS = ("choice", "text")


def check_study(ctx: Context, q: QuestionView) -> None:
    if q.kind is not None and q.kind not in STUDY_KINDS:
        ctx.error(f"{q.where}.kind", f"a study set asks choice or text questions only, not {q.kind}")
    if blank(str_at(q.raw, "topic")):
        ctx.warning(f"{q.where}.topic", "add a topic: the review scores the question under it")
    points = q.raw.get("points")
    if points is not None and not (is_number(points) and math.isfinite(points) and points > 0):
        ctx.error(f"{q.where}.points", "points must be a number above 0")
    if q.kind == "choice" and q.options_given:
        _check_study_options(ctx, q)
    if q.kind == "text" and not _has_grading(q.raw):
        ctx.error(f"{q.where}.rubric", "a quiz text question needs a rubric or a model_answer for the grader")


def _check_study_options(ctx: Context, q: QuestionView) -> None:
    correct = sum(1 for _, o in q.options if o.get("correct") is True)
    if correct != 1:
        ctx.error(f"{q.where}.options", f"mark exactly one option correct: true (now {correct})")
    for where, option in q.options:
        why = option.get("why")
        if why is None or (isinstance(why, str) and not why.strip()):
            ctx.error(f"{where}.why", "say why this option is right, or the mistake it stands for")


def _has_grading(raw: dict[str, Any]) -> bool:
    rubric, model_answer = raw.get("rubric"), raw.get("model_answer")
    if isinstance(rubric, list):
        # [""] grades nothing: only a rubric item with words in it does.
        if any(not isinstance(item, str) or item.strip() for item in rubric):
            return True
    elif rubric is not None and not (isinstance(rubric, str) and not rubric.strip()):
        return True
    return model_answer is not None and not (isinstance(model_answer, str) and not model_answer.strip())
