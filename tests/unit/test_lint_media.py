"""Media type, mimetype and resolution, against an in-memory file system."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

import pytest

from bridge.questionset.media import (
    Streams,
    captions_for,
    media_type,
    mimetype,
    playable_everywhere,
    resolve,
)

SET = "/p/sets/takes"


@dataclass
class FakeFilesystem:
    """Absolute paths of files, folders and symlinks; relative paths are taken from the set folder."""

    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    base: str = SET

    def realpath(self, path: str) -> str:
        pending = posixpath.join(self.base, path).split("/")
        current, hops = "/", 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                current = posixpath.dirname(current)
                continue
            candidate = posixpath.join(current, part)
            if candidate in self.links and hops < 40:  # a loop ends as a plain path, as on a real disk
                hops += 1
                target = self.links[candidate]
                current = "/" if target.startswith("/") else current
                pending = target.split("/") + pending
                continue
            current = candidate
        return current

    def is_file(self, path: str) -> bool:
        return self.realpath(path) in self.files

    def is_dir(self, path: str) -> bool:
        real = self.realpath(path)
        return real in self.dirs or real == self.base


def fs_with(*files: str, dirs: tuple[str, ...] = (), links: dict[str, str] | None = None) -> FakeFilesystem:
    return FakeFilesystem(files=set(files), dirs={SET, "/p/renders", "/p/extra", *dirs}, links=links or {})


@pytest.mark.parametrize(
    ("src", "kind"),
    [
        ("a.mp4", "video"), ("A.MOV", "video"), ("x/y.m4v", "video"), ("c.webm", "video"),
        ("s.mp3", "audio"), ("s.m4a", "audio"), ("s.wav", "audio"), ("s.ogg", "audio"),
        ("s.oga", "audio"), ("s.opus", "audio"), ("s.flac", "audio"),
        ("i.png", "image"), ("i.jpg", "image"), ("i.JPEG", "image"), ("i.gif", "image"),
        ("i.webp", "image"), ("i.svg", "image"), ("i.avif", "image"),
        ("notes.txt", None), ("noext", None), (".png", None), ("dir.png/file", None),
    ],
)
def test_media_type_from_extension(src: str, kind: str | None) -> None:
    assert media_type(src) == kind


@pytest.mark.parametrize(
    ("src", "expected"),
    [("a.mp4", "video/mp4"), ("a.opus", "audio/opus"), ("a.avif", "image/avif"), ("a.svg", "image/svg+xml"),
     ("a.jpg", "image/jpeg"), ("a.vtt", "text/vtt"), ("a.unknownext", "application/octet-stream")],
)
def test_mimetype(src: str, expected: str) -> None:
    assert mimetype(src) == expected


def test_relative_src_prefers_the_set_folder_then_roots_in_order() -> None:
    fs = fs_with(f"{SET}/clip.mp4", "/p/renders/clip.mp4", "/p/extra/only.mp4", "/p/renders/only.mp4")
    roots = ["../../renders", "/p/extra"]
    assert resolve("clip.mp4", roots, fs).path == f"{SET}/clip.mp4"
    assert resolve("only.mp4", roots, fs).path == "/p/renders/only.mp4"
    assert resolve("only.mp4", ["/p/extra", "../../renders"], fs).path == "/p/extra/only.mp4"


def test_missing_file() -> None:
    assert resolve("gone.mp4", ["../../renders"], fs_with()).status == "missing"


@pytest.mark.parametrize("src", ["../secret.png", "../../secret.png", "sub/../../secret.png", "../takes-evil/x.png"])
def test_dotdot_escape_is_outside(src: str) -> None:
    fs = fs_with("/p/sets/secret.png", "/p/secret.png", "/p/sets/takes-evil/x.png")
    assert resolve(src, [], fs).status == "outside"


def test_dotdot_that_stays_inside_is_fine() -> None:
    fs = fs_with(f"{SET}/a.png")
    assert resolve("sub/../a.png", [], fs).ok


def test_symlink_out_of_the_set_is_outside() -> None:
    fs = fs_with("/etc/passwd.png", links={f"{SET}/link.png": "/etc/passwd.png"})
    assert resolve("link.png", [], fs).status == "outside"


def test_symlinked_folder_out_of_the_set_is_outside() -> None:
    fs = fs_with("/home/me/pic.png", links={f"{SET}/media": "/home/me"})
    assert resolve("media/pic.png", [], fs).status == "outside"


def test_symlink_to_a_media_root_is_allowed() -> None:
    fs = fs_with("/p/renders/clip.mp4", links={f"{SET}/clip.mp4": "/p/renders/clip.mp4"})
    assert resolve("clip.mp4", ["/p/renders"], fs).path == "/p/renders/clip.mp4"


def test_absolute_src_inside_root_or_set_only() -> None:
    fs = fs_with(f"{SET}/a.png", "/p/renders/b.png", "/p/other/c.png")
    assert resolve(f"{SET}/a.png", [], fs).ok
    assert resolve("/p/renders/b.png", ["/p/renders"], fs).ok
    assert resolve("/p/renders/b.png", [], fs).status == "outside"
    assert resolve("/p/other/c.png", ["/p/renders"], fs).status == "outside"
    assert resolve("/p/renders/none.png", ["/p/renders"], fs).status == "missing"


def test_a_missing_root_allows_nothing() -> None:
    fs = fs_with("/p/gone/a.png")
    assert resolve("/p/gone/a.png", ["/p/gone"], fs).status == "outside"


def test_a_sibling_folder_with_a_common_prefix_is_outside() -> None:
    fs = fs_with("/p/sets/takes2/a.png")
    assert resolve("/p/sets/takes2/a.png", [], fs).status == "outside"


@pytest.mark.parametrize("src", ["", "a\x00.png"])
def test_unusable_src(src: str) -> None:
    assert not resolve(src, [], fs_with()).ok


def test_captions_beside_the_video() -> None:
    fs = fs_with("/p/renders/clip.mp4", "/p/renders/clip.vtt", f"{SET}/solo.mp4")
    roots = ["/p/renders"]
    assert captions_for(resolve("clip.mp4", roots, fs), roots, fs) == "/p/renders/clip.vtt"
    assert captions_for(resolve("solo.mp4", roots, fs), roots, fs) is None
    assert captions_for(resolve("gone.mp4", roots, fs), roots, fs) is None


def test_captions_that_lead_outside_are_ignored() -> None:
    fs = fs_with(f"{SET}/clip.mp4", "/etc/x.vtt", links={f"{SET}/clip.vtt": "/etc/x.vtt"})
    assert captions_for(resolve("clip.mp4", [], fs), [], fs) is None


@pytest.mark.parametrize(
    ("streams", "playable"),
    [
        (Streams(("h264",), ("aac",)), True),
        (Streams(("h264",), ("mp3",)), True),
        (Streams(("h264",), ()), True),
        (Streams(("hevc",), ("aac",)), False),
        (Streams(("h264",), ("opus",)), False),
        (Streams((), ("aac",)), False),
    ],
)
def test_playable_everywhere(streams: Streams, playable: bool) -> None:
    assert playable_everywhere(streams) is playable
