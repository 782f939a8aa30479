"""What a Matrix user id looks like, for every place that takes one from
people (a set's ``answerers``, the config's ``answerers`` and ``admins``):
one rule, so an id one of them takes the others take too.  Pure, and light
(the config imports it before anything else is loaded)."""

from __future__ import annotations

import re
from typing import Any

from bridge.protocol.graphemes import shorten

# @localpart:server (the grammar's characters, loosely; the server part as given).
_USER_ID = re.compile(r"^@[^\s:]+:[^\s]+$")
USER_ID_MAX = 255


def user_id_problem(value: Any) -> str | None:
    """None for a user id; else what is wrong with ``value``, in words."""
    if not isinstance(value, str):
        return "must be a Matrix user id such as @ana:example.org"
    if len(value) > USER_ID_MAX or not _USER_ID.fullmatch(value):
        shown = shorten(value, 60)
        return f'"{shown}" is not a Matrix user id (like @ana:example.org)'
    return None
