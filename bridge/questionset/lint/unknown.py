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


def check_unknown(ctx: Context, obj: Any, level: str, where: str) -> None:
    if not isinstance(obj, dict):
        return
    for name in obj:
        if name not in _KNOWN[level]:
            place = f"{where}.{name}" if where else str(name)
            ctx.warning(place, f"{quote(str(name))} is not a field of {_LEVEL_NAMES[level]}; remove it or fix its spelling")
