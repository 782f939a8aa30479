"""Typed sections read from plain YAML data, each error naming its key.

The config is the first thing the bridge reads, on its way to the answers
waiting in its first sync; loading pydantic for it cost more than the rest
of the config together.  A section here is a keyword-only dataclass whose
annotations say what each key holds: ``str``, ``bool``, ``int``, ``Path``,
``Duration``, a ``Literal``, ``X | None``, ``list[X]``, ``dict[str, X]`` or
another section.  Unknown keys are refused, missing keys without a default
are "required", and ``check`` holds the rules that span a section.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

# "90s", "30m", "24h", "2d", "1w"; a bare number is seconds.
MAX_DURATION_SECONDS = 100 * 365 * 86400
# ASCII digits only: \d alone takes "٣h" or "３h", which no other reader of a set does.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.ASCII)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_TRUE = {"true", "yes", "on", "1", "t", "y"}
_FALSE = {"false", "no", "off", "0", "f", "n"}


class Invalid(ValueError):
    """``message`` about the key at ``path`` (relative to the section that raised it)."""

    def __init__(self, message: str, *path: str):
        super().__init__(message)
        self.message = message
        self.path = tuple(path)

    def under(self, *prefix: str) -> "Invalid":
        return Invalid(self.message, *prefix, *self.path)


class Duration(str):
    """A duration as written (``30m``, ``24h``, ``2d``, a number of seconds): kept as text, checked on reading."""


def parse_duration(value: str | int | float) -> float:
    """Seconds in a duration such as ``30m``, ``24h`` or ``2d``; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 30m, 24h or 2d")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # a whole number of hundreds of digits
            raise ValueError("must be a duration such as 30m, 24h or 2d, not that long") from None
    else:
        match = _DURATION.match(str(value).lower())
        if not match:
            raise ValueError("must be a duration such as 30m, 24h or 2d")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError("must be a duration above zero, such as 30m, 24h or 2d")
    return seconds


@dataclasses.dataclass(kw_only=True)
class Section:
    # Per key, the smallest whole number it takes (``int`` keys only).
    minimum: ClassVar[dict[str, int]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True)(cls)  # every section is a keyword-only dataclass

    @classmethod
    def read(cls, raw: Any) -> "Section":
        if not isinstance(raw, dict):
            raise Invalid("must be a mapping of keys to values")
        hints = _hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in fields:
                raise Invalid("is not a known key", str(key))
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name in raw:
                try:
                    values[name] = _convert(hints[name], raw[name])
                    if name in cls.minimum and values[name] < cls.minimum[name]:
                        raise Invalid(f"must be at least {cls.minimum[name]}")
                except Invalid as exc:
                    raise exc.under(name) from None
                except ValueError as exc:
                    raise Invalid(str(exc), name) from None
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise Invalid("is required", name)
        section = cls(**values)
        try:
            section.check()
        except Invalid:
            raise
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return section

    def check(self) -> None:
        """Rules beyond each key's type; raise ``Invalid(message, key)`` or ValueError (the section)."""


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _convert(tp: Any, value: Any) -> Any:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _convert(inner, value)
    if origin is Literal:
        if value not in args:
            raise Invalid("must be one of " + ", ".join(repr(arg) for arg in args))
        return value
    if origin is list:
        if not isinstance(value, list):
            raise Invalid("must be a list")
        out = []
        for n, item in enumerate(value):
            try:
                out.append(_convert(args[0], item))
            except Invalid as exc:
                raise exc.under(str(n)) from None
        return out
    if origin is dict:
        if not isinstance(value, dict):
            raise Invalid("must be a mapping")
        out_dict = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise Invalid("must be a text key", str(key))
            try:
                out_dict[key] = _convert(args[1], item)
            except Invalid as exc:
                raise exc.under(key) from None
        return out_dict
    if isinstance(tp, type) and issubclass(tp, Section):
        return tp.read(value)
    if tp is Duration:
        # Kept as text the reading takes again: a YAML number as its seconds
        # (str(1e20) is "1e+20", which passed here and failed after the first sync).
        try:
            seconds = parse_duration(value)
            if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
                raise ValueError("must be a duration of at most 100 years, such as 30m, 24h or 2d")
            text = f"{seconds:.3f}".rstrip("0").rstrip(".") if isinstance(value, (int, float)) else value
            parse_duration(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        return Duration(text)
    if tp is bool:
        return _boolean(value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]+", value.strip()):
            return int(value)  # (str.isdigit took "--5" and "²", which int() then refused in its own words)
        raise Invalid("must be a whole number")
    if tp is str:
        if not isinstance(value, str):
            raise Invalid("must be text (quote it in YAML)")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)) or not str(value):
            raise Invalid("must be a path")
        return Path(value)
    raise TypeError(f"no reading for {tp!r}")  # a section annotated with a type this module does not know


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise Invalid("must be true or false")
