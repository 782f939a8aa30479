"""Who may change what in a room, as the Matrix spec and clients have it.

Pure.  An edit (``m.replace``) counts only from the sender of the event it
edits; clients ignore any other.  A redaction counts from the sender of its
target, or from someone whose power level reaches the room's ``redact``
level (the homeserver lets anyone send one; whether it applies depends on
this).
"""

from __future__ import annotations

from typing import Any

DEFAULT_REDACT = 50  # the spec's default for "redact" when the room's power levels omit it


def power_of(user: str, levels: dict[str, Any] | None) -> int:
    levels = levels or {}
    users = levels.get("users") if isinstance(levels.get("users"), dict) else {}
    value = users.get(user, levels.get("users_default", 0))
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def may_redact(redacter: str, target_sender: str, levels: dict[str, Any] | None) -> bool:
    """Whether ``redacter``'s redaction of an event ``target_sender`` sent counts."""
    if redacter == target_sender:
        return True
    if not levels:
        return False  # power levels not known: only the sender's own redaction counts
    needed = levels.get("redact", DEFAULT_REDACT)
    needed = needed if isinstance(needed, int) and not isinstance(needed, bool) else DEFAULT_REDACT
    return power_of(redacter, levels) >= needed


def edit_target(event: dict[str, Any]) -> str | None:
    """The event an ``m.replace`` edit edits; None for anything else."""
    if event.get("type") != "m.room.message":
        return None
    content = event.get("content")
    relates = content.get("m.relates_to") if isinstance(content, dict) else None
    if isinstance(relates, dict) and relates.get("rel_type") == "m.replace" and isinstance(relates.get("event_id"), str):
        return relates["event_id"]
    return None
