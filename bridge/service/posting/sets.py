"""Finding the set folders under ``sets.root``, and reading one as the bridge posts it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.questionset.model import QuestionSet

log = logging.getLogger(__name__)

QUESTIONS = "questions.json"
# Folders the bridge itself writes into a set, never sets of their own.
SKIPPED = frozenset({"attachments"})


def discover(root: Path, unreadable: list[OSError] | None = None) -> list[Path]:
    """Every folder below ``root`` (itself included) holding questions.json, in a stable order.
    Symlinked folders are not followed, and a questions.json that is a
    symlink leading out of the root is no set: a set must really live under the root.
    ``unreadable``: gets each folder that could not be listed (the root too)."""
    found: list[Path] = []
    for current, files in folders(root, unreadable):
        if QUESTIONS in files and not leads_outside(Path(current) / QUESTIONS, root):
            found.append(Path(current))
    return found


def leads_outside(questions: Path, root: Path) -> bool:
    """Whether ``questions`` (a set's questions.json) is a symlink leading out
    of ``root``: no set then, however the bridge came to look at it (said)."""
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(questions), real_root]) == real_root:
        return False
    log.warning("%s leads outside %s; not read as a set", questions, root)
    return True


def folders(root: Path, unreadable: list[OSError] | None = None) -> Iterator[tuple[str, list[str]]]:
    """Every folder below ``root`` (itself included) that may be or hold a
    set, with its files: hidden folders, ``attachments`` and symlinked
    folders are passed over; one that can't be listed goes to ``unreadable``."""
    for current, dirs, files in os.walk(root, followlinks=False,
                                        onerror=unreadable.append if unreadable is not None else None):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED)
        yield current, files


def duplicate_set_message(set_id: str, owner: str, refused: str) -> str:
    """What the log, ``status`` and lint say of a second folder under a set id."""
    return (f"set id \u201c{set_id}\u201d of {refused} is already the id of the set in {owner}; "
            f"{refused} is not posted until it has an id of its own")


def load_set(set_dir: Path, posted_revs_of: Callable[[str], Mapping[str, int]] | None = None,
             answerers: Iterable[str] = ()) -> tuple[QuestionSet | None, list[str]]:
    """A set the bridge may post: it loads and lints without error.
    ``posted_revs_of``: the store's highest posted rev per question of a
    folder: a posted revision whose fixed deadline passed is its deadline
    come, not a mistake (lint refused the whole set, and nothing new in it
    was posted again).  ``answerers``: the bridge's own (lint's)."""
    from bridge.agents.closing import blocks_close
    from bridge.questionset.load import LoadError
    from bridge.questionset.setdir import load_set_dir

    try:
        resolved = os.path.realpath(set_dir)
        revs = {resolved: posted_revs_of(resolved)} if posted_revs_of is not None else None
        result = load_set_dir(set_dir, probe=False, posted_revs=revs, answerers=answerers)
    except LoadError as exc:
        return None, [exc.message]
    # A set whose every question is closed or withdrawn is finished, not
    # broken: the poster still closes its questions in the room.
    errors = [f"{finding.where}: {finding.message}" for finding in result.errors
              if result.model is None or blocks_close(finding.where, finding.message)]
    if errors or result.model is None:
        return None, errors or ["the set could not be read"]
    return result.model, []
