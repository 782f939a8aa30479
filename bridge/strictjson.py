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


def loads(text: str | bytes) -> Any:
    """``json.loads`` refusing the constants; raises ValueError (JSONDecodeError or NotJson)."""
    return json.loads(text, parse_constant=no_constant)
