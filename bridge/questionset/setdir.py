"""Loading and linting a set folder from disk: the I/O around the pure lint.

Used by ``askwright-bridge lint`` and by the service when it scans sets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Callable

from bridge import strictjson
from bridge.questionset.load import LoadError, parse_json
from bridge.questionset.media import LocalFilesystem, Probe, Streams, ffprobe_command
from bridge.regularfile import NotRegular, read_regular

if TYPE_CHECKING:  # imported when a folder is linted, not by every reader of questions.json
    from bridge.questionset.lint import LintResult

QUESTIONS_FILE = "questions.json"
# Written by the agents' API beside the questions.json of a set it took (its
# owner); such a set is linted as confined to its own folder.
AGENT_OWNER_FILE = ".askwright-agent.json"
PROBE_TIMEOUT_SECONDS = 30
# Far above any real set; stops a runaway file from being read into memory.
MAX_QUESTIONS_BYTES = 16 * 1024 * 1024


def questions_bytes(raw: dict[str, Any]) -> bytes:
    """questions.json as the bridge writes it (an agent's set, a close):
    indented for people to read, or compact where indenting would take it
    past the format's 16 MB (a set that fits as written is never pushed
    over by the bridge's own rewriting).  Raises ``strictjson.NotJson`` for
    a string UTF-8 can't write, or a number JSON can't (``1e400``, which a
    door's parser, the MCP SDK's, read as infinity)."""
    try:
        data = json.dumps(raw, indent=2, ensure_ascii=False, allow_nan=False).encode() + b"\n"
    except UnicodeEncodeError:
        # Half a surrogate pair, from a door whose parser let it through (the
        # MCP SDK's): ``strictjson.NotJson`` says where.
        strictjson.check_text(raw)
        raise
    except ValueError:
        raise strictjson.NotJson("a number JSON cannot hold: infinity or NaN (1e400 is read as infinity)") from None
    if len(data) <= MAX_QUESTIONS_BYTES:
        return data
    return json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def set_paths(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(set folder, questions.json) for a set folder, or for the questions.json itself."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return path, os.path.join(path, QUESTIONS_FILE)
    if os.path.basename(path) == QUESTIONS_FILE:
        return os.path.dirname(path) or ".", path
    raise LoadError(f"{path} is not a set folder (a folder holding {QUESTIONS_FILE})")


def questions_data(file: str | os.PathLike[str]) -> bytes:
    """questions.json's bytes, read only from a regular file (``regularfile``:
    OSError as it raises); LoadError past the format's 16 MB, which no reader
    takes for a set (the bridge never posts it)."""
    data = read_regular(file, MAX_QUESTIONS_BYTES)
    if len(data) > MAX_QUESTIONS_BYTES:
        raise LoadError(f"{file} is larger than {MAX_QUESTIONS_BYTES // (1024 * 1024)} MB")
    return data


def read_questions(file: str) -> dict:
    """The parsed object in questions.json; LoadError for anything unreadable."""
    try:
        data = questions_data(file)
    except NotRegular:
        raise LoadError(f"{file} is not a regular file") from None
    except FileNotFoundError:
        raise LoadError(f"{file} does not exist") from None
    except OSError as exc:
        raise LoadError(f"{file} can't be read: {exc.strerror or exc}") from None
    try:
        return parse_json(data)
    except LoadError:
        raise
    except RecursionError:
        raise LoadError(f"{file} is nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with thousands of digits
        raise LoadError(f"{file} is not usable JSON: {exc}") from None


def ffprobe(executable: str) -> Probe:
    """A probe that asks ffprobe for the codec of every stream."""

    def probe(path: str) -> Streams | None:
        command = ffprobe_command(executable, "stream=codec_type,codec_name", path)
        try:
            done = subprocess.run(command, capture_output=True, timeout=PROBE_TIMEOUT_SECONDS, check=False)
            streams = json.loads(done.stdout or b"{}").get("streams") if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
        if not isinstance(streams, list):
            return None
        return _streams(streams)

    return probe


def _streams(entries: list[object]) -> Streams:
    by_type: dict[str, list[str]] = {"video": [], "audio": []}
    for entry in entries:
        if isinstance(entry, dict) and entry.get("codec_type") in by_type:
            by_type[entry["codec_type"]].append(str(entry.get("codec_name") or "unknown"))
    return Streams(video=tuple(by_type["video"]), audio=tuple(by_type["audio"]))


def find_probe(which: Callable[[str], str | None] = shutil.which) -> Probe | None:
    """ffprobe when it is on the PATH; without it the codec check is skipped."""
    executable = which("ffprobe")
    return ffprobe(executable) if executable else None


def load_set_dir(path: str | os.PathLike[str], *, probe: bool | Probe | None = True,
                 posted_revs: Mapping[str, Mapping[str, int]] | None = None,
                 answerers: Iterable[str] | None = None) -> LintResult:
    """Read and lint one set folder.

    ``probe``: True finds ffprobe on the PATH, False/None skips the codec
    check, or a probe callable to use.  ``posted_revs``: set folder
    (resolved) -> question id -> the highest rev the bridge posted (from its
    store), so a rev that went back is a warning; ``answerers``: the bridge's
    (``lint``).  Raises ``LoadError`` when
    the folder or its questions.json can't be read, isn't JSON or isn't an
    object.  A set the agents' API wrote (it holds ``AGENT_OWNER_FILE``) is
    linted as confined: its media only from inside its own folder.
    """
    set_dir, file = set_paths(path)
    raw = read_questions(file)
    chosen = find_probe() if probe is True else (probe or None)
    from bridge.questionset.lint import lint

    revs = (posted_revs or {}).get(os.path.realpath(set_dir), {})  # the poster keys postings by the resolved folder
    confined = os.path.lexists(os.path.join(set_dir, AGENT_OWNER_FILE))
    return lint(raw, LocalFilesystem(os.path.abspath(set_dir)), probe=chosen, posted_revs=revs, confined=confined,
                answerers=answerers)
