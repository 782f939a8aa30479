"""The latest checkpoint the bridge signed, kept beside the log's key too.

The store keeps every checkpoint, and at start the bridge checks the leaves
against the latest of them before it signs on.  Whoever can change the store
can also delete its checkpoints: with none left, a rewritten log would be
signed on as if it were the bridge's.  So the latest signed checkpoint goes
into a file beside the key (``<key file>.checkpoint``), where a store's
owner does not write: the leaves must make that one too.  A store restored
from an older backup is caught the same way: the rooms hold checkpoints of
more leaves, and signing on would fork the log they vouch for.

A standby keeps its own file, of what it signed while it led: an older
checkpoint of the same log, which the leaves make all the same.
"""

from __future__ import annotations

from pathlib import Path

from bridge.wholefile import replace_whole


def witness_file(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".checkpoint")


def read_witness(path: Path | None) -> str | None:
    """The signed note kept there; None when there is none yet."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def keep_witness(path: Path, note: str) -> None:
    """The note written whole; OSError when the disk refuses."""
    replace_whole(path, note.encode("utf-8"))
