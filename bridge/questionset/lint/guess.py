"""The guess a question carries: its pick, checked against the question's kind and options."""

from __future__ import annotations

from typing import Any

from bridge.questionset.lint.access import blank, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown

SINGLE_PICK_KINDS = ("choice", "compare", "scale", "confirm")


def check_guess(ctx: Context, q: QuestionView) -> None:
    guess = q.raw.get("guess")
    if guess is None:
        if not ctx.study:
            ctx.error(f"{q.where}.guess", "add your guess (with a why and a confidence of high or low)")
        return
    if not isinstance(guess, dict):
        return  # a type error
    where = f"{q.where}.guess"
    check_unknown(ctx, guess, "guess", where)
    _check_guess_pick(ctx, q, guess, where)
    if blank(str_at(guess, "why")):
        ctx.error(f"{where}.why", "say why you guess this")
    if "confidence" not in guess or guess.get("confidence") is None:
        ctx.error(f"{where}.confidence", "set confidence to high or low")


def _check_guess_pick(ctx: Context, q: QuestionView, guess: dict[str, Any], where: str) -> None:
    # Membership is only checked against a usable list of options: when the
    # options themselves are missing, that is the one thing reported.
    ids = q.option_ids
    checkable = q.options_given and bool(ids)
    if q.kind in SINGLE_PICK_KINDS:
        pick = guess.get("option")
        if pick is None:
            ctx.error(f"{where}.option", "name the option you guess (its id) in option")
        elif isinstance(pick, str) and checkable and pick not in ids:
            ctx.error(f"{where}.option", f"{quote(pick)} is not one of this question's option ids")
    elif q.kind == "multi":
        _check_guess_multi(ctx, guess, where, ids if checkable else None)
    elif q.kind == "rank":
        _check_guess_rank(ctx, guess, where, ids if checkable else None)
    elif q.kind == "text":
        text = guess.get("text")
        if text is None or (isinstance(text, str) and not text.strip()):
            ctx.error(f"{where}.text", "write the answer you guess in text")


def _check_guess_multi(ctx: Context, guess: dict[str, Any], where: str, ids: list[str] | None) -> None:
    picks = guess.get("options")
    if picks is None:
        ctx.error(f"{where}.options", "list the option ids you guess in options")
        return
    if not isinstance(picks, list) or not all(isinstance(p, str) for p in picks):
        return  # a type error
    # A multi answer needs at least one pick (the answer event's rule), so a guess does too.
    if not picks:
        ctx.error(f"{where}.options", "guess at least one option")
    elif len(set(picks)) != len(picks):
        ctx.error(f"{where}.options", "an option is listed twice; list each guessed option once")
    elif ids is not None and (unknown := [p for p in picks if p not in ids]):
        ctx.error(f"{where}.options", f"{', '.join(quote(p) for p in unknown)} not among this question's option ids")


def _check_guess_rank(ctx: Context, guess: dict[str, Any], where: str, ids: list[str] | None) -> None:
    order = guess.get("order")
    if order is None:
        ctx.error(f"{where}.order", "give the order you guess: every option id once")
        return
    if not isinstance(order, list) or not all(isinstance(p, str) for p in order) or ids is None:
        return
    if sorted(order) != sorted(ids):
        missing = [i for i in ids if i not in order]
        extra = sorted({p for p in order if p not in ids})
        twice = sorted({p for p in order if p in ids and order.count(p) > 1})
        parts = []
        if missing:
            parts.append("missing " + ", ".join(quote(i) for i in missing))
        if twice:
            parts.append("listed twice: " + ", ".join(quote(p) for p in twice))
        if extra:
            parts.append("not option ids: " + ", ".join(quote(p) for p in extra))
        if not parts:  # only when the options themselves repeat an id
            parts.append("the options repeat an id")
        ctx.error(f"{where}.order", f"the order must hold every option id exactly once ({'; '.join(parts)})")
