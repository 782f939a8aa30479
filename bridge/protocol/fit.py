"""Values the bridge can keep: what JSON, the store and the homeserver all hold.

A person's event can carry values that parse in Python but break a write
later: an infinity or NaN (``answers.json`` refuses them, Synapse refuses
floats altogether), an integer past 2^53 (JSON readers round it, SQLite
overflows at 2^63), a lone surrogate (not UTF-8, so neither the file nor the
store can encode it), a NUL character (PostgreSQL's text holds none, though
SQLite's does: refused on both, so the backends agree), a string longer than
any answer may be.  They are refused where they enter, with a reason, so
nothing one event carries can fail a write for everyone after it.  Pure.
"""

from __future__ import annotations

import math
from typing import Any

MAX_SAFE_INT = 2**53 - 1
# Longer than any field of a record may be (20,000 characters) with room to spare.
MAX_STRING = 65_536
MAX_DEPTH = 32


def unfit(value: Any, _depth: int = 0) -> str | None:
    """Why ``value`` can't be kept, or None when every part of it can."""
    if _depth > MAX_DEPTH:
        return "nested too deeply"
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else "a number too large to keep exactly"
    if isinstance(value, float):
        return None if math.isfinite(value) else "a number that is not finite"
    if isinstance(value, str):
        return unfit_text(value)
    if isinstance(value, dict):
        for key, item in value.items():
            problem = (unfit_text(key) if isinstance(key, str) else "a key that is not text") \
                or unfit(item, _depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for item in value:
            problem = unfit(item, _depth + 1)
            if problem:
                return problem
        return None
    return f"a value of type {type(value).__name__}"


def unfit_text(text: str) -> str | None:
    if len(text) > MAX_STRING:
        return "text too long to keep"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text that is not valid Unicode"
    if "\x00" in text:
        return "text with a NUL character"
    return None


def fit_id(value: Any) -> bool:
    """An event, room or user id the store can key by."""
    return isinstance(value, str) and 0 < len(value) <= 255 and unfit_text(value) is None


def timestamp(value: Any) -> int:
    """``origin_server_ts`` as the store keeps it: 0 when missing or out of range."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SAFE_INT:
        return value
    return 0
