"""A JSON Schema ``pattern`` as the schema means it: an ECMA-262 regular
expression, where ``$`` is the end of the string.

Python's ``$`` also matches just before a final newline, so with ``re``
alone "planner\\n" matches "^[a-z]+$": an id, a file name or a set folder
with a newline at its end would pass every check written that way.  Every
schema the bridge checks against (the OpenAPI document, the MCP tools' inputs,
the Matrix event schemas) is checked with ``Validator`` or ``compiled``."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError


# ECMA-262's classes, where Python's differ: its \s is these (Python's also
# takes U+001C-U+001F and U+0085, and not U+FEFF), its \d and \w are ASCII.
_ECMA_SPACE = "\\t\\n\\v\\f\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_ECMA_CLASSES = {"s": _ECMA_SPACE, "d": "0-9", "w": "A-Za-z0-9_"}


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` for ``re.search``: each ``$`` outside a class and not
    escaped made ``\\Z``, and ``\\s``, ``\\d``, ``\\w`` (and their negations)
    spelled out as ECMA-262 means them."""
    out, escaped, in_class = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
            inner = _ECMA_CLASSES.get(char.lower())
            if inner is not None and (not in_class or char.islower()):
                out.pop()  # the backslash
                if in_class:
                    out.append(inner)  # (a negation inside a class keeps Python's meaning)
                else:
                    out.append(f"[{inner}]" if char.islower() else f"[^{inner}]")
                continue
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            out.append(r"\Z")
            continue
        out.append(char)
    return re.compile("".join(out))


def _pattern(validator: Any, pattern: str, instance: Any, _schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# Draft 2020-12 with ``pattern`` as ECMA-262 reads it.
Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})
