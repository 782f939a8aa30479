"""Where the store knows the sets: by their folders' paths.

Every row about a set names its folder as a path (``posted.set_dir`` and
the tables beside it).  Move the sets root (a new disk, another mount path)
and start the bridge on it, and the store finds none of its sets: each one
looked removed (every question closed in the room) and each folder new
(every question posted again).  So a start refuses when the store's sets
are all missing and the sets root holds them at the same places below it
(``sets_seen_elsewhere``), and ``store move-sets`` moves the store's paths
along with the folders (``move_sets``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from bridge.service.config import Config, ConfigError

# The tables whose rows name a set's folder, and the meta keys that do.
SET_DIR_TABLES = ("posted", "answer_log", "dirty", "attachment", "held_set", "doomed_file")
# (The key goes on after the folder: a "/" below it, or "\x1f" and more.)
SET_SYNCED, REV_FIRST_POSTED = "set_synced:", "rev_first_posted:"
NOT_POSTED = "set_not_posted:"  # why the poster could not post the set (its room refuses the bridge, say)
FOLDER_KEYED_META = (SET_SYNCED, REV_FIRST_POSTED, NOT_POSTED)
# Meta whose value names a folder: a file still coming (``downloads.py``),
# {"set_dir": ..., ...}: taken up again after a start, into that folder.
DOWNLOAD_KEPT = "download:"


def sets_seen_elsewhere(folders: list[str], root: Path) -> str | None:
    """The folder the store's open sets are under when none of them is at its
    path on this machine and ``root`` holds them at the same places below it
    (the sets moved, or a share mounted at another path; nested sets too,
    and some removed meanwhile), else None.

    Of the folders all the sets are below, the one whose sets ``root`` holds
    the most of at the same places (the shallowest of equals): an unrelated
    set that happens to share a name must not decide it.  A folder at or
    below ``root`` that is there is no other root: sets under it that are
    gone were deleted, not moved."""
    if not folders or any(os.path.isdir(folder) for folder in folders):
        return None
    best, most = None, 0
    parts = Path(folders[0]).parts
    for depth in range(1, len(parts)):
        old_root = Path(*parts[:depth])
        if not all(Path(folder).is_relative_to(old_root) for folder in folders):
            break
        if old_root.is_relative_to(root) and old_root.is_dir():
            continue
        found = sum((root / Path(folder).relative_to(old_root)).is_dir() for folder in folders)
        if found > most:
            best, most = str(old_root), found
    return best


class SetsElsewhere(ConfigError):
    """The store's sets are under another root: the start refuses with exit 1
    (docs/operators.md), where a config refused exits 2."""


def check_sets_where_known(folders: list[str], config: Config) -> None:
    """SetsElsewhere when the store's sets are seen under another root (see the module)."""
    elsewhere = sets_seen_elsewhere(folders, config.sets.root)
    if elsewhere is None:
        return
    raise SetsElsewhere(
        f"sets.root: the sets the store knows are under {elsewhere}, which this machine does not have, and "
        f"{config.sets.root} here holds them.  The store knows a set by its folder's path: started like "
        "this, every question would be closed and posted again.  If the sets moved, stop every instance and "
        f"run `askwright-bridge store move-sets -c <config> --from {elsewhere}`; if this is a standby seeing "
        "a share at another path, mount it at the same path on every instance")


def sets_outside(folders: list[str], root: Path) -> list[str]:
    """The store's set folders with open questions that are not below
    ``root``: another instance's ``sets.root`` (a standby configured apart
    from its leader) would leave them unwatched and new sets unposted."""
    resolved = Path(os.path.realpath(root))
    return [folder for folder in folders
            if not Path(os.path.realpath(folder)).is_relative_to(resolved)]


def warn_sets_outside(folders: list[str], config: Config) -> None:
    """Say so when open sets are not below ``sets.root`` (``sets_outside``)."""
    outside = sets_outside(folders, config.sets.root)
    if outside:
        logging.getLogger("bridge.sets").warning(
            "sets.root is %s, but the store has open questions in %d set folder(s) outside it (%s%s): their "
            "folders are not watched here, and sets written under the root the other instances use are not "
            "posted. Every instance sharing a store needs the same sets.root", config.sets.root, len(outside),
            outside[0], ", ..." if len(outside) > 1 else "")


class MoveRefused(Exception):
    """One sentence: why nothing was moved."""


def move_sets(store: Any, old_root: str, new_root: str) -> int:
    """Every path the store holds under ``old_root`` made the same place
    under ``new_root``, in one transaction; the number of set folders moved."""
    old, new = old_root.rstrip("/") or "/", new_root.rstrip("/") or "/"
    if old == new:
        raise MoveRefused(f"{old} is sets.root already")
    under_old = _below(store, old)
    # Sets under both (the new root holds the old one, or the other way
    # round) are the ones moving, not sets posted at the new place.
    under_new = [folder for folder in _below(store, new) if folder not in under_old]
    if not under_old:
        raise MoveRefused(f"the store knows no set under {old}")
    if under_new:
        raise MoveRefused(f"the store knows sets under {new} already ({under_new[0]}, ...): they were posted "
                          "there anew, and two sets can't be made one")
    with store.transaction():
        for table in SET_DIR_TABLES:
            store.db.execute(f"UPDATE {table} SET set_dir = ? || substr(set_dir, ?) "
                             "WHERE set_dir = ? OR substr(set_dir, 1, ?) = ?",
                             (new, len(old) + 1, old, len(old) + 1, old + "/"))
        for prefix in FOLDER_KEYED_META:
            start = len(prefix + old) + 1
            store.db.execute("UPDATE meta SET key = ? || substr(key, ?) WHERE key = ? OR substr(key, 1, ?) IN (?, ?)",
                             (prefix + new, start, prefix + old, start, prefix + old + "/", prefix + old + "\x1f"))
        for key, value in store.meta_with_prefix(DOWNLOAD_KEPT):
            kept = json.loads(value)
            folder = kept.get("set_dir")
            if isinstance(folder, str) and (folder == old or folder.startswith(old.rstrip("/") + "/")):
                store.set_meta(key, json.dumps({**kept, "set_dir": new + folder[len(old):]}))
    return len(under_old)


def _below(store: Any, root: str) -> list[str]:
    """The set folders the store knows at or below ``root``."""
    rows = store.db.execute("SELECT DISTINCT set_dir FROM posted WHERE set_dir = ? OR substr(set_dir, 1, ?) = ?",
                            (root, len(root) + 1, root + "/")).fetchall()
    return sorted(row[0] for row in rows)
