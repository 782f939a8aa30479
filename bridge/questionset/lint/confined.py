"""Sets an agent sent through the HTTP API or MCP: media only from inside their own folder.

A local agent may name media roots anywhere on the bridge's disk: it could
read those files itself.  A remote agent holds only a token, and must not
turn it into a key to every file the bridge can read (another set's
people's screenshots, say).  So for such a set (its folder holds the
owner file the API writes) a media root or a ``src`` that is absolute,
climbs with ``..`` or leads out of the folder through a symlink is an
error, and says how a remote agent gets a file there instead.
"""

from __future__ import annotations

import os
import posixpath

from bridge.questionset import media as media_rules
from bridge.questionset.lint.access import list_at, quote
from bridge.questionset.lint.context import Context, QuestionView

WHY = ("a set sent through the HTTP API or MCP may use media only from inside its own folder; "
       "upload the file with PUT /v1/sets/{id}/media/{name} (or the upload_media tool) and name it by src")


def path_problem(path: str) -> str | None:
    """Why ``path`` (a media root or src) can't be named by such a set on its face, or None."""
    if os.path.isabs(path) or posixpath.isabs(path) or path.startswith("\\") or (len(path) > 1 and path[1] == ":"):
        return "is an absolute path"
    if ".." in path.replace("\\", "/").split("/"):
        return "climbs out with .."
    return None


def root_problem(root: str, fs: media_rules.Filesystem) -> str | None:
    """Why a media root can't serve such a set, or None."""
    problem = path_problem(root)
    if problem is None and fs.is_dir(root) and not media_rules.is_inside(fs.realpath(root), fs.realpath(".")):
        problem = "leads outside the set folder (through a symlink)"
    return problem


def safe_roots(roots: list[str], fs: media_rules.Filesystem) -> list[str]:
    """The media roots media may be resolved in: those inside the set folder."""
    return [root for root in roots if root_problem(root, fs) is None]


def check_confined_roots(ctx: Context) -> None:
    for i, root in enumerate(list_at(ctx.raw, "media_roots") or []):
        if isinstance(root, str) and (problem := root_problem(root, ctx.fs)):
            ctx.error(f"media_roots[{i}]", f"{quote(root)} {problem}; {WHY}")


def check_confined_backgrounds(ctx: Context, q: QuestionView) -> None:
    """A background block's file is resolved and posted like a media item: the same rule."""
    for i, block in enumerate(list_at(q.raw, "one_pager") or []):
        src = block.get("src") if isinstance(block, dict) else None
        if isinstance(src, str) and (problem := path_problem(src)):
            ctx.error(f"{q.where}.one_pager[{i}].src", f"{quote(src)} {problem}; {WHY}")
