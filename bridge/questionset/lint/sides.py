"""A compare question's sides: which option is shown where, and whether that was drawn at random."""

from __future__ import annotations

from typing import Any

from bridge.questionset.lint.access import quote
from bridge.questionset.lint.context import Context, QuestionView


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
