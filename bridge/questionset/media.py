"""Media in a question set: its type, its mimetype, and where its file is.

The resolution rules are pure: they ask a small ``Filesystem`` the only
questions they need (is this a file, a folder, where does it really point),
so lint and the server can be tested without touching a disk.  Paths handed
to a ``Filesystem`` are relative to the set folder unless absolute.

Rules (from the format):
* a relative ``src`` is looked for in the set folder first, then in each
  media root in order;
* an absolute ``src`` is allowed only when it resolves inside the set folder
  or a media root;
* anything else fails as "outside", including ``..`` escapes and symlinks
  whose target lies outside every allowed folder.
"""

from __future__ import annotations

import mimetypes
import os
import posixpath
from dataclasses import dataclass
from typing import Callable, Literal, Protocol

MediaType = Literal["video", "audio", "image"]

_TYPE_BY_EXTENSION: dict[str, MediaType] = {
    **{ext: "video" for ext in ("mp4", "m4v", "webm", "mov")},
    **{ext: "audio" for ext in ("mp3", "m4a", "wav", "ogg", "oga", "opus", "flac")},
    **{ext: "image" for ext in ("png", "jpg", "jpeg", "gif", "webp", "svg", "avif")},
}

# What an agent may upload for a set: the media table, and a video's captions.
UPLOAD_EXTENSIONS = (*_TYPE_BY_EXTENSION, "vtt")

# Spelled out because the platform's mimetypes table differs between systems
# (several of these, e.g. opus and avif, are missing on older ones) and the
# bridge must send the same mimetype wherever it runs.
_MIMETYPE_BY_EXTENSION = {
    "mp4": "video/mp4",
    "m4v": "video/x-m4v",
    "webm": "video/webm",
    "mov": "video/quicktime",
    "mp3": "audio/mpeg",
    "m4a": "audio/mp4",
    "wav": "audio/wav",
    "ogg": "audio/ogg",
    "oga": "audio/ogg",
    "opus": "audio/opus",
    "flac": "audio/flac",
    "png": "image/png",
    "jpg": "image/jpeg",
    "jpeg": "image/jpeg",
    "gif": "image/gif",
    "webp": "image/webp",
    "svg": "image/svg+xml",
    "avif": "image/avif",
    "vtt": "text/vtt",
}

CAPTIONS_EXTENSION = ".vtt"


def extension(src: str) -> str:
    """The lower-case extension without its dot ("" when there is none)."""
    name = src.replace("\\", "/").rsplit("/", 1)[-1]
    if "." not in name.lstrip("."):
        return ""
    return name.rsplit(".", 1)[-1].lower()


def media_type(src: str) -> MediaType | None:
    """video, audio or image from the extension; None when it tells nothing."""
    return _TYPE_BY_EXTENSION.get(extension(src))


def mimetype(src: str) -> str:
    ext = extension(src)
    if ext in _MIMETYPE_BY_EXTENSION:
        return _MIMETYPE_BY_EXTENSION[ext]
    guessed, _ = mimetypes.guess_type("file." + ext) if ext else (None, None)
    return guessed or "application/octet-stream"


class Filesystem(Protocol):
    """The file-system questions media resolution asks.

    Relative paths are taken relative to the set folder.
    """

    def is_file(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def realpath(self, path: str) -> str:
        """The absolute path with every symlink followed (also for a path that does not exist)."""
        ...


@dataclass(frozen=True)
class LocalFilesystem:
    """The real disk, seen from one set folder."""

    set_dir: str

    def _abs(self, path: str) -> str:
        return os.path.join(self.set_dir, path)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self._abs(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._abs(path))

    def realpath(self, path: str) -> str:
        return os.path.realpath(self._abs(path))


@dataclass(frozen=True)
class Resolved:
    """Where a ``src`` led.

    ``status`` is ``ok`` (``path`` is the real file), ``missing`` (no such
    file in any allowed folder) or ``outside`` (it leads out of every allowed
    folder).  ``named`` is the path as looked up, before symlinks are
    followed: captions are looked for beside it.
    """

    status: Literal["ok", "missing", "outside"]
    path: str | None = None
    named: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def allowed_folders(media_roots: list[str], fs: Filesystem) -> list[str]:
    """The real paths media may come from: the set folder, then each existing media root.

    A root that does not exist is left out (lint reports it on its own), so it
    cannot widen what is allowed.
    """
    folders = [fs.realpath(".")]
    for root in media_roots:
        if fs.is_dir(root):
            folders.append(fs.realpath(root))
    return folders


def is_inside(path: str, folder: str) -> bool:
    """True when ``path`` is ``folder`` or lies below it (both already real and absolute)."""
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives, or a mix of absolute and relative
        return False


def _is_absolute(src: str) -> bool:
    return os.path.isabs(src) or posixpath.isabs(src)


def resolve(src: str, media_roots: list[str], fs: Filesystem) -> Resolved:
    """Find the file a media ``src`` names, or say why it can't be used."""
    if not src or "\x00" in src:
        return Resolved("missing")
    allowed = allowed_folders(media_roots, fs)
    if _is_absolute(src):
        candidates = [src]
    else:
        bases = ["."] + [root for root in media_roots if fs.is_dir(root)]
        candidates = [os.path.join(base, src) for base in bases]
    went_outside = False
    for candidate in candidates:
        real = fs.realpath(candidate)
        if not any(is_inside(real, folder) for folder in allowed):
            # Keep looking: the same relative name may sit safely in a later
            # root; "outside" is only the verdict when nothing allowed matched.
            went_outside = True
            continue
        if fs.is_file(candidate):
            return Resolved("ok", real, candidate)
    return Resolved("outside" if went_outside else "missing")


def captions_for(resolved: Resolved, media_roots: list[str], fs: Filesystem) -> str | None:
    """The real path of the ``.vtt`` beside a video, when there is one inside an allowed folder.

    It is looked for beside the path the ``src`` was found at (not beside a
    symlink's target): that is the file the set's author put captions next to.
    """
    if not resolved.ok or resolved.named is None:
        return None
    stem, _ = os.path.splitext(resolved.named)
    candidate = stem + CAPTIONS_EXTENSION
    if not fs.is_file(candidate):
        return None
    real = fs.realpath(candidate)
    if not any(is_inside(real, folder) for folder in allowed_folders(media_roots, fs)):
        return None
    return real


@dataclass(frozen=True)
class Streams:
    """The codecs a probe found in a media file, by stream type."""

    video: tuple[str, ...] = ()
    audio: tuple[str, ...] = ()


# A probe reads a file's streams (ffprobe in the shell); None means it could not.
Probe = Callable[[str], "Streams | None"]



def ffprobe_command(executable: str, entries: str, path: str) -> list[str]:
    """ffprobe's command line asking ``entries`` (``-show_entries``) of the
    local file ``path``, as JSON.  The file is anyone's (a person's, an
    agent's): it may be a playlist naming URLs, and ffprobe would fetch
    them (the bridge's own network, its internal addresses) on a version
    that allows it; only the file protocol is let in, and the path is given
    as a file URL so no name ("http:...", "-x") is read as anything else."""
    return [executable, "-v", "error", "-protocol_whitelist", "file", "-show_entries", entries, "-of", "json",
            "file:" + os.path.abspath(path)]


PLAYABLE_VIDEO = frozenset({"h264"})
PLAYABLE_AUDIO = frozenset({"aac", "mp3"})


def playable_everywhere(streams: Streams) -> bool:
    """H.264 video with AAC or MP3 sound, or with no sound: what every browser plays."""
    if not streams.video or any(codec not in PLAYABLE_VIDEO for codec in streams.video):
        return False
    return all(codec in PLAYABLE_AUDIO for codec in streams.audio)
