"""Tolerant reads of the raw dict (a value of the wrong type reads as absent), and user values quoted in messages."""

from __future__ import annotations

from typing import Any

from bridge.protocol.graphemes import shorten
from bridge.questionset.shown import visible


def value_at(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def str_at(obj: Any, key: str) -> str | None:
    value = value_at(obj, key)
    return value if isinstance(value, str) else None


def list_at(obj: Any, key: str) -> list[Any] | None:
    value = value_at(obj, key)
    return value if isinstance(value, list) else None


def dict_at(obj: Any, key: str) -> dict[str, Any] | None:
    value = value_at(obj, key)
    return value if isinstance(value, dict) else None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def blank(value: str | None) -> bool:
    """None, or nothing a person sees (spaces, a zero-width space)."""
    return value is None or not visible(value).strip()


def quote(text: str, limit: int = 60) -> str:
    """A user value inside a message, cut short so one huge value can't flood the report."""
    shown = shorten(text, limit)
    return f'"{shown}"'
