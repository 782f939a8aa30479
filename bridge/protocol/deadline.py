"""Times of the approval fields (PROTOCOL 2a): when a question expires, when it escalates.

Pure.  In ``questions.json`` ``expires`` (and ``escalate.after``) is either a
duration (the units ``reminders.after`` takes: ``45s``, ``90m``, ``2h``,
``3d``, ``1w``) counted from the first posting of that revision, or an RFC
3339 time with a zone.  The posted event carries the absolute time (RFC 3339,
UTC, whole seconds), so every reader of the room judges against the same
instant: an answer is late when its ``origin_server_ts`` is at or after it.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from bridge.service.sections import parse_duration

# An RFC 3339 date-time: a zone (Z or an offset) is required.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII)


def is_rfc3339(value: str) -> bool:
    return bool(_RFC3339.fullmatch(value.strip()))


def parse_rfc3339_ms(value: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time; ValueError when it is not one (or has no zone)."""
    text = value.strip()
    if not _RFC3339.fullmatch(text):
        raise ValueError("must be an RFC 3339 time with a zone, such as 2026-12-01T14:00:00Z")
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
    except ValueError:  # Python's own words ("offset must be a timedelta strictly between ...") told nobody what to fix
        raise ValueError("is not a time there is: a month, day, hour, minute or second out of range, or a zone "
                         "offset past ±23:59; such as 2026-12-01T14:00:00Z") from None
    return int(parsed.timestamp() * 1000)


# 9999-12-31T23:59:59.999Z: the last moment RFC 3339's four-digit year (and
# the event's own time field) can carry.
LATEST_MS = 253_402_300_799_999


def parse_when(value: Any, base_ms: int) -> int:
    """``value`` (a duration or an RFC 3339 time) as milliseconds since the epoch,
    a duration counted from ``base_ms``.  ValueError with plain words otherwise,
    also for a time the posted event could not carry (past the year 9999)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a duration such as 90m, 2h or 3d, or an RFC 3339 time with a zone")
    if is_rfc3339(value):
        at = parse_rfc3339_ms(value)
    elif re.match(r"^\s*\d{4}-", value, re.ASCII):
        raise ValueError("must be an RFC 3339 time with a zone, such as 2026-12-01T14:00:00Z")
    else:
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise ValueError("must be a duration such as 45s, 90m, 2h, 3d or 1w, "
                             "or an RFC 3339 time with a zone") from None
        at = base_ms + seconds * 1000  # a float: a duration too long for an int is inf, and too far away
    if at > LATEST_MS:
        raise ValueError("is too far away: it must fall before the year 10000")
    return int(at)


def format_rfc3339(ms: int) -> str:
    """The UTC RFC 3339 form the event carries (whole seconds are kept exactly, milliseconds when there are any)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    if ms % 1000:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_time_ms(value: Any) -> int | None:
    """An absolute time as the event carries it; None when absent or unreadable (read defensively)."""
    if not isinstance(value, str):
        return None
    try:
        return parse_rfc3339_ms(value)
    except ValueError:
        return None


# The times a question event carries (PROTOCOL 2a), each a path into its ``question``.
EVENT_TIMES = (("expires",), ("escalate", "after"))


def event_time_problem(question: Any) -> tuple[str, Any, str] | None:
    """(where, value, why) of the first time in a question event's
    ``question`` that is no RFC 3339 time with a zone; None when every one
    present is.  ``event_time_ms`` reads such a time as absent, so a question
    read from outside the bridge is checked with this first: taken as having
    no deadline, it would have every late answer judged in time."""
    if not isinstance(question, dict):
        return None
    for path in EVENT_TIMES:
        value: Any = question
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            continue
        try:
            if not isinstance(value, str):
                raise ValueError("must be an RFC 3339 time with a zone, such as 2026-12-01T14:00:00Z")
            parse_rfc3339_ms(value)
        except ValueError as exc:
            return ".".join(path), value, str(exc)
    return None


def clock_words(ms: int) -> str:
    """``14:00 UTC`` (with the date when it is not today's UTC date is asked for by ``in_words``)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%H:%M UTC") if moment.second == 0 else moment.strftime("%H:%M:%S UTC")


def when_words(ms: int, now_ms: int) -> str:
    """``14:00 UTC``, or ``Mon 18 Jan 2027, 14:00 UTC`` when it is not today (UTC)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    today = datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc).date()
    return clock_words(ms) if moment.date() == today else f"{moment.strftime('%a %d %b %Y')}, {clock_words(ms)}"


def deadline_words(expires_ms: int, now_ms: int) -> str:
    """``Answer by 14:00 UTC`` (the date too when it is not ``now_ms``'s day,
    UTC), or that it has passed.  A time, never the time left ("in 30
    minutes"): a message is read hours after it is posted, and a span counted
    from its posting was wrong from the next minute on; the time stays true,
    the event carries it exactly (``question.expires``), and the edit at the
    close says the deadline passed."""
    when = when_words(expires_ms, now_ms)
    if expires_ms <= now_ms:
        return f"Answer by {when} (the deadline has passed)"
    return f"Answer by {when}"
