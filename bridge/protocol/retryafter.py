"""The seconds an HTTP ``Retry-After`` header asks for.  Pure.

Read the same wherever a server answers 429 or 503: a receiver of the
agents' webhooks, the homeserver's media repository."""

from __future__ import annotations

from email.utils import parsedate_to_datetime


def retry_after_seconds(header: str | None, now: float, at_most: float) -> float:
    """Seconds, or an HTTP date (``now``: the wall clock), between 0 and
    ``at_most``; 0 when the header says nothing readable."""
    if not header:
        return 0.0
    text = header.strip()
    if text.isascii() and text.isdigit():  # "²" is a digit to str.isdigit, and no number to float
        seconds = float(text)
    else:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return 0.0
    return min(max(seconds, 0.0), at_most)
