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


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` for ``re.search``, each ``$`` outside a class and not escaped made ``\\Z``."""
    out, escaped, in_class = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
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
