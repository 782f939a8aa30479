"""Fields the format does not have: the model keeps them, so only this warning tells of a misspelling."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from bridge.questionset.lint.access import quote
from bridge.questionset.lint.context import Context
from bridge.questionset.model import Escalate, Guess, MediaItem, Option, Question, QuestionSet, Quorum, ShowIf, Subject


def _known(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(model.model_fields)


_KNOWN = {
    "set": _known(QuestionSet),
    "question": _known(Question),
    "option": _known(Option),
    "guess": _known(Guess),
    "media": _known(MediaItem),
    "show_if": _known(ShowIf),
    "subject": _known(Subject),
    "quorum": _known(Quorum),
    "escalate": _known(Escalate),
}


_LEVEL_NAMES = {
    "set": "the set",
    "question": "a question",
    "option": "an option",
    "guess": "a guess",
    "media": "a media item",
    "show_if": "show_if",
    "subject": "subject",
    "quorum": "quorum",
    "escalate": "escalate",
}


# How deep an unknown field's value may nest.  The model keeps it, and the
# bridge writes it out again (a question's digest, its event): 450 levels in
# a question linted clean, and the set was never posted ("maximum
# serialization depth exceeded" at every pass) while its agent was told 201.
MAX_DEPTH = 64


# Where a misspelt field changes what is decided, it is an error, not a
# warning: ``"vetoes": ["hold"]`` in a quorum was ignored, and an approval
# the agent meant anyone could stop went out that nobody could.
DECIDING = frozenset({"quorum"})


def check_unknown(ctx: Context, obj: Any, level: str, where: str) -> None:
    if not isinstance(obj, dict):
        return
    for name in obj:
        if name not in _KNOWN[level]:
            place = f"{where}.{name}" if where else str(name)
            if level in DECIDING:
                ctx.error(place, f"{quote(str(name))} is not a field of {_LEVEL_NAMES[level]} (it has "
                                 f"{', '.join(sorted(_KNOWN[level]))}); the bridge would ignore it, and decide "
                                 "otherwise than meant: remove it or fix its spelling")
            else:
                ctx.warning(place, f"{quote(str(name))} is not a field of {_LEVEL_NAMES[level]}; remove it or fix "
                                   "its spelling")
            if _deeper_than(obj[name], MAX_DEPTH):
                ctx.error(place, f"{quote(str(name))} nests more than {MAX_DEPTH} levels deep; the bridge can't "
                                 "keep it")


def check_depth(ctx: Context, question: dict[str, Any], where: str) -> None:
    """A question as a whole (a figure's spec is a known field that holds
    anything), its own few levels beside MAX_DEPTH for what it holds."""
    if _deeper_than(question, MAX_DEPTH + 4) and not any(f.where.startswith(where + ".") for f in ctx.errors):
        ctx.error(where, f"nests more than {MAX_DEPTH} levels deep (a figure's spec, say); the bridge can't keep it")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (no recursion: it may be deep)."""
    level: list[Any] = [value]
    for _depth in range(limit + 1):
        containers = [item for item in level if isinstance(item, (dict, list))]
        if not containers:
            return False
        level = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]
    return True
