"""A question's options: how many, their ids and their labels."""

from __future__ import annotations

import re
from typing import Any

from bridge.questionset.lint.access import blank, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown
from bridge.questionset.builtin import BUILTIN_IDS, OTHER_LABEL, UNSURE_LABEL
from bridge.questionset.shown import one_line_problem, reply_exact, reply_key


def _norm_label(label: str) -> str:
    return " ".join(label.strip().strip(".,:;!?()[]\"'").split()).lower()


_BARE_WORDS = frozenset(
    "left right top bottom middle center centre first second third fourth fifth last "
    "yes no ok okay y n yep nope yeah sure true false".split()
)
_BARE_PATTERNS = (
    re.compile(r"[a-z0-9]"),  # "B", "2"
    re.compile(r"#?\d+"),  # "12", "#3"
    re.compile(r"(option|choice|answer|number|item|no\.?|#)\s*[a-z0-9]{1,2}"),  # "Option 2", "Choice B"
    re.compile(r"(the )?(left|right|top|bottom|first|second|third|last)( one| option| side| take)?"),
)


def is_bare_label(label: str, *, kind: str | None = None) -> bool:
    """A label that names only a position or a yes/no, not what the person chooses."""
    norm = _norm_label(label)
    # On a scale the number is the value itself ("3" of 1..5), not a position.
    if kind == "scale" and re.fullmatch(r"-?\d+", norm):
        return False
    return norm in _BARE_WORDS or any(p.fullmatch(norm) for p in _BARE_PATTERNS)


_YES_NO_START = re.compile(r"(yes|no)\b", re.IGNORECASE)


def _option_id_problem(value: str) -> str | None:
    # Not in the format; decided here because replies name option ids and a
    # multi or rank answer lists them comma-separated, so an id must be
    # something a person can type back.
    if not value.strip():
        return "must not be empty"
    if len(value) > 64:
        return "is longer than 64 characters; shorten it"
    if re.search(r"[,\s]", value) or not value.isprintable():
        return "must not hold commas, spaces or control characters; use letters, digits, _, . or -"
    return None


def check_options(ctx: Context, q: QuestionView) -> None:
    raw_options = q.raw.get("options")
    if q.kind == "text":
        # An empty list offers nothing either, so only a non-empty one fails.
        if isinstance(raw_options, list) and raw_options:
            ctx.error(f"{q.where}.options", "a text question takes no options; remove them (the person writes the answer)")
        return
    if q.kind is None and raw_options is None:
        return  # the kind is a type error; nothing tells whether options are needed
    if raw_options is None:
        ctx.error(f"{q.where}.options", "add the options the person picks from (at least two)")
        return
    if not q.options_given:
        return  # a type error
    _check_option_count(ctx, q)
    seen_ids: set[str] = set()
    seen_labels: set[str] = set()
    ids = {reply_key(oid): oid for _where, option in q.options if (oid := str_at(option, "id")) is not None}
    for position, (where, option) in enumerate(q.options, 1):
        check_unknown(ctx, option, "option", where)
        _check_option_id(ctx, where, option, seen_ids)
        _check_option_label(ctx, q, where, option, seen_labels, ids)
        consequence = str_at(option, "consequence")
        if consequence is not None and (problem := one_line_problem(consequence)):
            # Shown on the option's own numbered line: a break there adds lines
            # of its own ("2. Drop the database") that a reply's number picks wrong.
            ctx.error(f"{where}.consequence", f"the consequence {problem}")
        if q.kind == "scale":  # (elsewhere a number for a label is a bare position already)
            _check_number_label(ctx, where, option, position)


def _check_number_label(ctx: Context, where: str, option: dict[str, Any], position: int) -> None:
    """A reply's number is the option's place in the list (PROTOCOL): on a
    scale from 0, or story points 1, 2, 3, 5, 8, someone replying with the
    value they read is read as another option."""
    label = str_at(option, "label")
    if label is None or not re.fullmatch(r"-?\d{1,3}", label.strip()) or int(label.strip()) == position:
        return
    number = int(label.strip())
    picks = f"picks option {number}" if number >= 1 else "picks nothing (the list is numbered from 1)"
    ctx.warning(f"{where}.label", f"a reply's number is the option's place in the list: a person replying "
                                  f"{quote(label.strip())} {picks}, not this one (option "
                                  f"{position}); number the labels from 1 in order, or use words "
                                  "(a poll vote picks right either way)")


def _check_option_count(ctx: Context, q: QuestionView) -> None:
    count = len(q.raw["options"])
    if q.kind == "confirm":
        if count not in (2, 3):
            ctx.error(f"{q.where}.options", f"a confirm question offers two or three actions, not {count}")
    elif count < 2:
        ctx.error(f"{q.where}.options", f"offer at least two options, not {count}")


def _check_option_id(ctx: Context, where: str, option: dict[str, Any], seen: set[str]) -> None:
    oid = str_at(option, "id")
    if oid is None:
        return
    if oid.casefold() in BUILTIN_IDS:  # a reply names an option by id in any case: "Unsure" is the built-in's
        ctx.error(f"{where}.id", f"{quote(oid)} is a built-in answer every question offers; give this option another id")
    elif problem := _option_id_problem(oid):
        ctx.error(f"{where}.id", f"the option id {problem}")
    elif oid in seen:
        ctx.error(f"{where}.id", f"two options have the id {quote(oid)}; give each its own id")
    seen.add(oid)


# The built-ins as a reply names them: their ids, labels and "not sure" (``replies``).
BUILTIN_WORDS = frozenset(reply_key(words) for words in (*BUILTIN_IDS, "not sure", UNSURE_LABEL, OTHER_LABEL))


def _check_option_label(ctx: Context, q: QuestionView, where: str, option: dict[str, Any], seen: set[str],
                        ids: dict[str, str]) -> None:
    label = str_at(option, "label")
    if label is None:
        return
    if blank(label):
        ctx.error(f"{where}.label", "give the option a label: the words the person picks")
        return
    if problem := one_line_problem(label):
        ctx.error(f"{where}.label", f"the label {problem}")
    # Two labels are one when a reply can't tell them apart.  A reply written
    # as the label tells apart its case and closing mark, so a quiz may offer
    # "We" and "we", "Stop." and "Stop!" as different answers; elsewhere the
    # reply is read loosely ("Ship it!" is "ship it"), and so are the labels.
    # Spaces and invisible characters tell nothing apart anywhere ("Ship  it").
    key = reply_exact(label) if ctx.study else reply_key(label)
    named_id = ids.get(reply_key(label))
    if reply_key(label) in BUILTIN_WORDS:
        ctx.error(f"{where}.label", f"{quote(label)} names a built-in answer every question offers (a reply "
                                    "saying it picks that one); label this option otherwise")
    elif named_id is not None and named_id != str_at(option, "id"):
        ctx.error(f"{where}.label", f"{quote(label)} is the id of another option: a reply saying it picks that "
                                    "option (a reply's words are read as an id first); label this option otherwise")
    elif key in seen:
        ctx.error(f"{where}.label", f"another option is also labelled {quote(label)} (as a reply reads it); "
                                    "make each label distinct")
    seen.add(key)
    if q.kind == "confirm" and _YES_NO_START.match(label.strip()):
        ctx.error(f"{where}.label", f"{quote(label)} starts with Yes or No; name the action instead (\"Ship it\", \"Hold the release\")")
    elif not ctx.study and is_bare_label(label, kind=q.kind):
        # In a quiz "Left", "B" or "Yes" can be the answer itself, so the rule is off there.
        ctx.error(f"{where}.label", f"{quote(label)} is a bare position or yes/no; say what choosing it means")
