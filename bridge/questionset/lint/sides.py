"""A compare question's sides: which option is shown where, and whether that was drawn at random."""

from __future__ import annotations

from typing import Any

from bridge.questionset.lint.access import blank, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.options import BUILTIN_WORDS
from bridge.questionset.shown import one_line_problem, reply_key


def check_sides(ctx: Context, q: QuestionView) -> None:
    sides = q.raw.get("sides")
    if sides is None or q.kind is None:
        return
    where = f"{q.where}.sides"
    if q.kind != "compare":
        ctx.error(where, "sides only belong on a compare question; remove them")
        return
    if not isinstance(sides, dict):
        return
    _check_randomized(ctx, sides, where)
    names = {name: value for name, value in sides.items() if name != "randomized"}
    ids = q.option_ids
    _check_side_names(ctx, q, where, list(names))
    for name, value in names.items():
        if not isinstance(value, str):
            ctx.error(f"{where}.{name}", "a side must name one of this question's option ids")
        elif q.options_given and ids and value not in ids:
            ctx.error(f"{where}.{name}", f"{quote(value)} is not one of this question's option ids")
    # Decided here: side by side means at least two sides, each a different take.
    if len(names) < 2:
        ctx.error(where, "map at least two sides (e.g. left and right) to option ids")
    elif len(set(v for v in names.values() if isinstance(v, str))) < sum(isinstance(v, str) for v in names.values()):
        ctx.error(where, "two sides name the same option; each side shows a different take")


def _check_randomized(ctx: Context, sides: dict[str, Any], where: str) -> None:
    randomized = sides.get("randomized")
    message = (
        "the sides are not marked as drawn at random, so the person may learn which side is which; "
        "set randomized to true only when a pair tool drew them at random (a fixed order keeps this warning)"
    )
    if "randomized" not in sides:
        ctx.warning(f"{where}.randomized", message)
    elif not isinstance(randomized, bool):
        ctx.error(f"{where}.randomized", "randomized must be true or false")
    elif randomized is False:
        ctx.warning(f"{where}.randomized", message)


def _check_side_names(ctx: Context, q: QuestionView, where: str, names: list[str]) -> None:
    """A side's name is what the person reads for its option ("Left: take 2")
    and may reply with: it must be words, one line, its own, and no built-in's."""
    labels = {reply_key(label) for _where, option in q.options if (label := str_at(option, "label")) is not None}
    seen: set[str] = set()
    for name in names:
        key = reply_key(name)
        if blank(name):
            ctx.error(f"{where}.{name}", "a side needs a name the person reads (left, right)")
        elif problem := one_line_problem(name):
            ctx.error(f"{where}.{name}", f"the side's name {problem}")
        elif key in BUILTIN_WORDS:
            ctx.error(f"{where}.{name}", f"{quote(name)} names a built-in answer every question offers; name the "
                                         "side otherwise")
        elif key in seen:
            ctx.error(f"{where}.{name}", f"two sides are named {quote(name)} (as a reply reads them); name each "
                                         "its own")
        elif key in labels:
            ctx.error(f"{where}.{name}", f"{quote(name)} is also an option's label; a reply saying it could mean "
                                         "either")
        seen.add(key)
