"""People's files, for agents that are not on the bridge's disk.

``read`` lists a person's files as absolute paths (askwright's shape, for a
local agent).  The HTTP API and MCP give each as ``{"name", "type", "size",
"sha256", "url"}`` instead, the ``url`` being where the door serves it: the
HTTP route, or the MCP resource URI.

Only a file an answer in the set's answers.json names is served, from the
set's own ``attachments/`` folder, never through a symlink.  Hashing a
file of megabytes runs in a thread and is remembered by (path, mtime,
size), so an agent that reads again and again does not rehash it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.agents.errors import BadRequest, NotFound
from bridge.questionset.media import mimetype

ATTACHMENTS = "attachments"
# The names the bridge gives people's files (``<qid>-<n>.<ext>``): no /,
# never a dot first, so always one file directly in ``attachments/`` (and
# only one answers.json names is served).  A question id may hold dots in a
# row (``v1..2``), so its files' names do.  The OpenAPI document's pattern is NAME's.
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # checked with fullmatch: $ also matches before a final newline
NAME_MAX = 200
HASH_CHUNK = 1024 * 1024

Link = Callable[[str], str]


def check_name(name: str, where: str = "name") -> str:
    """``name`` when it can only be a file directly in ``attachments/``; BadRequest naming ``where`` otherwise."""
    if not isinstance(name, str) or len(name) > NAME_MAX or not NAME.fullmatch(name):
        message = f"a file name of at most {NAME_MAX} characters: letters, digits, _, - and dots, not first, no /"
        raise BadRequest(f"{where}: {message}", findings=[{"where": where, "message": message}])
    return name


def attachment_path(set_dir: Path, name: str) -> Path:
    """The file ``name`` in the set's own attachments folder; NotFound when it
    is not a regular file there (a symlink, anywhere, counts as not there)."""
    check_name(name)
    folder = Path(set_dir) / ATTACHMENTS
    real_set = os.path.realpath(set_dir)
    if os.path.realpath(folder) != os.path.join(real_set, ATTACHMENTS):
        raise NotFound(f"no file {name!r} in this set")
    path = folder / name
    try:
        info = os.lstat(path)
    except OSError:
        raise NotFound(f"no file {name!r} in this set") from None
    if not stat.S_ISREG(info.st_mode):
        raise NotFound(f"no file {name!r} in this set")
    return path


def named_in(view: dict[str, Any], set_dir: Path) -> set[str]:
    """The attachment names the answers of ``view`` (read's, absolute paths) name."""
    folder = os.path.join(os.path.abspath(set_dir), ATTACHMENTS)
    found = set()
    for entry in view.get("answers") or ():
        for path in entry.get("attachments") or ():
            if isinstance(path, str) and os.path.dirname(path) == folder:
                found.add(os.path.basename(path))
    return found


@dataclass(frozen=True)
class Described:
    size: int
    sha256: str


class Digests:
    """sha256 of files, remembered by (path, mtime, size); bounded."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._known: OrderedDict[tuple[str, int, int], str] = OrderedDict()

    async def describe(self, path: Path) -> Described | None:
        """Size and sha256 of the regular file at ``path``; None when it is not there."""
        try:
            info = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        key = (str(path), info.st_mtime_ns, info.st_size)
        digest = self._known.get(key)
        if digest is not None:
            self._known.move_to_end(key)
            return Described(info.st_size, digest)
        try:
            mtime_ns, size, digest = await asyncio.to_thread(_hash_file, path)
        except OSError:
            return None
        self._known[(str(path), mtime_ns, size)] = digest
        while len(self._known) > self.limit:
            self._known.popitem(last=False)
        return Described(size, digest)


def _hash_file(path: Path) -> tuple[int, int, str]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        digest = hashlib.sha256()
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return info.st_mtime_ns, info.st_size, digest.hexdigest()


async def with_file_objects(view: dict[str, Any], set_dir: Path, link: Link, digests: Digests) -> dict[str, Any]:
    """``view`` (read's) with each answer's attachments as objects; ``link``
    gives a file's url from its name.  A path outside ``attachments/`` (a
    record the bridge did not write) or a file gone from disk keeps its name,
    with size, sha256 and url null."""
    folder = os.path.join(os.path.abspath(set_dir), ATTACHMENTS)
    answers = []
    for entry in view["answers"]:
        if entry.get("attachments") == []:
            answers.append(entry)  # nothing to describe (most entries): not copied
            continue
        files = []
        # Over HTTP and MCP a file says who sent it when it was not the picker
        # (the file system's paths stay on the bridge's side).
        by = entry.get("attachments_by") or {}
        for path in entry.get("attachments") or ():
            described = await _file_object(str(path), folder, set_dir, link, digests)
            files.append({**described, "sent_by": by[path]} if path in by else described)
        answers.append({**{k: v for k, v in entry.items() if k != "attachments_by"}, "attachments": files})
    return {**view, "answers": answers}


async def _file_object(path: str, folder: str, set_dir: Path, link: Link, digests: Digests) -> dict[str, Any]:
    name = os.path.basename(path)
    if os.path.dirname(path) != folder or len(name) > NAME_MAX or not NAME.fullmatch(name):
        shown = os.path.relpath(path, os.path.abspath(set_dir))
        return {"name": shown, "type": mimetype(shown), "size": None, "sha256": None, "url": None}
    try:
        described = await digests.describe(attachment_path(set_dir, name))
    except NotFound:
        described = None
    return {"name": name, "type": mimetype(name), "size": described.size if described else None,
            "sha256": described.sha256 if described else None, "url": link(name) if described else None}
