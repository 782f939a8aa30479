"""The model's type errors, worded like the rules, and the places they cover."""

from __future__ import annotations

import re

from bridge.questionset.load import Finding


def under_any(where: str, places: list[str]) -> bool:
    return any(where == p or where.startswith(p + ".") or where.startswith(p + "[") for p in places)


_TYPE_WORDS = (
    (re.compile(r" or instance of \w+"), ""),
    (re.compile(r"a valid dictionary"), "an object"),
    (re.compile(r"a valid list"), "a list"),
    (re.compile(r"a valid string"), "a string"),
    (re.compile(r"a valid integer"), "an integer"),
    (re.compile(r"a valid boolean"), "true or false"),
    (re.compile(r"a valid number"), "a number"),
)


def merge_type_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per place: a union type fails once per member ("a string" / "a list")."""
    merged: dict[str, list[str]] = {}
    for f in findings:
        message = f.message
        for pattern, replacement in _TYPE_WORDS:
            message = pattern.sub(replacement, message)
        messages = merged.setdefault(f.where, [])
        if message not in messages:
            messages.append(message)
    return [Finding(where, ", or ".join(messages)) for where, messages in merged.items()]
