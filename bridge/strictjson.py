"""JSON as RFC 8259 writes it.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity``, which no
other reader takes and which Synapse and canonical JSON refuse; every door
that reads JSON from outside refuses them through this one rule.
"""

from __future__ import annotations

import json
from typing import Any


class NotJson(ValueError):
    """A constant that Python's json reads and JSON does not have."""


def no_constant(name: str) -> Any:
    raise NotJson(f"{name} is not JSON")


def loads(text: str | bytes, *, unique_keys: bool = False) -> Any:
    """``json.loads`` refusing the constants; raises ValueError (JSONDecodeError
    or NotJson).  ``unique_keys``: an object naming a key twice is refused
    too (RFC 8259 leaves its meaning open: Python keeps the last, other
    readers the first), at the cost of a slower parse: for the requests an
    agent sends, not for its set files."""
    if unique_keys:
        return json.loads(text, parse_constant=no_constant, object_pairs_hook=_unique)
    return json.loads(text, parse_constant=no_constant)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise NotJson(f"the key {twice[:100]!r} appears twice in one object")
    return value
