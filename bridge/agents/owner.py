"""Who asked a set: a small file in the set folder, written with the set.

A file rather than a store row: ``askwright-bridge mcp`` on stdio runs as its
own process beside the bridge, and the set folder is what both share.  A
folder without this file was written by a local agent and belongs to no
agent of the API."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from bridge.questionset.setdir import AGENT_OWNER_FILE, QUESTIONS_FILE

OWNER_FILE = AGENT_OWNER_FILE


@dataclass(frozen=True)
class Owner:
    agent: str
    callbacks: tuple[str, ...] = field(default_factory=tuple)
    # The answer log's size when the agent made the set: the leaves before
    # it are of an earlier set of that name (its folder removed since, or a
    # local agent's), never this agent's to read.
    log_from: int = 0
    # Claimed for the agent's media before its set's first PUT: no set of
    # the agent's yet.  A questions.json that comes into it then was put
    # there by someone else (a local agent writing that folder), and the
    # folder is not the agent's: it would read and close a set it never asked.
    claimed: bool = False

    def as_dict(self) -> dict[str, object]:
        return {"agent": self.agent, "callbacks": list(self.callbacks),
                **({"log_from": self.log_from} if self.log_from else {}),
                **({"claimed": True} if self.claimed else {})}


def read_owner(set_dir: str | os.PathLike[str]) -> Owner | None:
    try:
        data = json.loads((Path(set_dir) / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("agent"), str):
        return None
    callbacks = data.get("callbacks")
    urls = tuple(u for u in callbacks if isinstance(u, str)) if isinstance(callbacks, list) else ()
    log_from = data.get("log_from")
    claimed = data.get("claimed") is True
    if claimed and (Path(set_dir) / QUESTIONS_FILE).exists():
        return None  # a set the agent never put, in the folder it claimed: not the agent's
    return Owner(data["agent"], urls, log_from if type(log_from) is int and log_from > 0 else 0, claimed)


def owner_bytes(owner: Owner) -> bytes:
    return json.dumps(owner.as_dict(), indent=2).encode() + b"\n"
