"""Finding the set folders under ``sets.root``."""

from __future__ import annotations

import os
from pathlib import Path

QUESTIONS = "questions.json"
# Folders the bridge itself writes into a set, never sets of their own.
_SKIP = {"attachments"}


def discover(root: Path) -> list[Path]:
    """Every folder below ``root`` (itself included) holding questions.json, in a stable order.
    Symlinked folders are not followed: a set must really live under the root."""
    found: list[Path] = []
    for current, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP)
        if QUESTIONS in files:
            found.append(Path(current))
    return found
