"""JSON as RFC 8259 writes it.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``-Infinity`` (and
``1e400`` as infinity), which no other reader takes and which Synapse and canonical JSON refuse; every door
that reads JSON from outside refuses them through this one rule.  So too a
string holding half a surrogate pair (``"\\ud800"``): JSON's escapes can
spell it, UTF-8 can't write it, so the set or answers file it would go into
could never be written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# A \u escape of a surrogate: only a text holding one is searched for a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class NotJson(ValueError):
    """What Python's json reads and JSON does not have: a constant, half a surrogate pair."""


def no_constant(name: str) -> Any:
    raise NotJson(f"{name} is not JSON")


def finite(text: str) -> float:
    """A JSON number as Python reads it, but one past a double's range
    (``1e400``): Python reads it as infinity, and writes it back as
    ``Infinity``, which no reader takes (the set could never be read again)."""
    value = float(text)
    if math.isinf(value):
        raise NotJson(f"the number {text[:40]} is too large to read (it is past what a double holds)")
    return value


def loads(text: str | bytes, *, unique_keys: bool = False, utf8_only: bool = True) -> Any:
    """``json.loads`` refusing the constants; raises ValueError (JSONDecodeError
    or NotJson).  ``unique_keys``: an object naming a key twice is refused
    too (RFC 8259 leaves its meaning open: Python keeps the last, other
    readers the first), at the cost of a slower parse: for the requests an
    agent sends, not for its set files.  ``utf8_only``: half a surrogate
    pair is refused (not for a reader that names the record holding one)."""
    if isinstance(text, bytes):
        # UTF-8, strictly (RFC 8259 8.1; a byte-order mark passed over): Python
        # reads bytes with "surrogatepass", so an encoded half surrogate pair
        # (and UTF-16 text) came through.
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise NotJson(f"not UTF-8 (byte {exc.start})") from None
    if unique_keys:
        value = json.loads(text, parse_constant=no_constant, parse_float=finite, object_pairs_hook=_unique)
    else:
        value = json.loads(text, parse_constant=no_constant, parse_float=finite)
    if utf8_only and _SURROGATE_ESCAPE.search(text):
        check_text(value)
    return value


def check_text(value: Any) -> None:
    """Raises NotJson at the first string (or key) UTF-8 can't write."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _writable(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                _writable(key)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def _writable(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotJson(f"a string holds half a surrogate pair ({ascii(text[exc.start])}), "
                      "which UTF-8 can't write") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise NotJson(f"the key {twice[:100]!r} appears twice in one object")
    return value


def load_object(data: bytes | str, name: str) -> dict[str, Any]:
    """The JSON object a file holds (``name``: the file, as messages call
    it), a byte-order mark some writers put before it passed over; NotJson
    saying in one line why it is none."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise NotJson(f"{name} is not UTF-8 (byte {exc.start})") from None
    try:
        value = loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise NotJson(f"{name} is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except NotJson as exc:
        raise NotJson(f"{name}: {exc}") from None
    except RecursionError:
        raise NotJson(f"{name} is nested too deeply") from None
    except ValueError as exc:  # a number of more digits than Python reads (4,300), say
        raise NotJson(f"{name} is not usable JSON: {exc}") from None
    if not isinstance(value, dict):
        raise NotJson(f"{name} must hold a JSON object, not {type(value).__name__}")
    return value
