"""Turning the bytes of a ``questions.json`` into a model, or into findings.

Pure: the caller reads the file.  Every failure is a ``LoadError`` that says
where and what, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge import strictjson

if TYPE_CHECKING:
    from bridge.questionset.model import QuestionSet


@dataclass(frozen=True)
class Finding:
    where: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message}


class LoadError(Exception):
    """The file is not JSON or not an object: nothing else can be checked."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def parse_json(data: bytes | str) -> dict[str, Any]:
    """questions.json's object, by JSON's own rules (RFC 8259), as the agents'
    door reads a set too: a byte-order mark some editors write is passed
    over; NaN and Infinity, which Python's parser takes, are no JSON."""
    try:
        return strictjson.load_object(data, "questions.json")
    except strictjson.NotJson as exc:
        raise LoadError(str(exc)) from None


def where_of(loc: tuple[Any, ...], raw: dict[str, Any] | None = None) -> str:
    """A pydantic location as the finding's ``where``: questions[2] becomes the question's id."""
    parts: list[str] = []
    node: Any = raw
    i = 0
    while i < len(loc):
        key = loc[i]
        if isinstance(key, int):
            label = f"[{key}]"
            if isinstance(node, list) and 0 <= key < len(node) and isinstance(node[key], dict):
                ident = node[key].get("id")
                if isinstance(ident, str) and ident:
                    label = f"[{ident}]"
            parts.append(label)
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
        else:
            parts.append(("." if parts else "") + str(key))
            node = node.get(key) if isinstance(node, dict) else None
        i += 1
    return "".join(parts) or "set"


def validate_model(raw: dict[str, Any]) -> tuple[QuestionSet | None, list[Finding]]:
    """The model, or the type errors found on the way (each with its place)."""
    # The models (pydantic) load on the first set read, not with the
    # readers of a questions.json that never validate one (the judge's path).
    from pydantic import ValidationError

    from bridge.questionset.model import QuestionSet

    try:
        return QuestionSet.model_validate(raw), []
    except ValidationError as exc:
        findings = []
        for err in exc.errors(include_url=False):
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in {"str", "int", "float", "bool"})))
            findings.append(Finding(where_of(loc, raw), _plain(err)))
        return None, findings


def _plain(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "missing":
        return "this field is required"
    if kind == "literal_error":
        return err["msg"].replace("Input should be", "must be")
    if kind.endswith("_type"):
        return err["msg"].replace("Input should be", "must be")
    return err["msg"]
