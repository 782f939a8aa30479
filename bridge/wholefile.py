"""Files written whole: the one way the bridge writes a file that anyone
else reads (``answers.json``, an agent's ``questions.json`` and media, keys,
the registration).

The bytes go to a temporary file beside the name, are fsynced, and the
temporary file is renamed over the name; then the folder is fsynced, so the
rename survives a power cut too.  A reader sees the old file or the new one,
never part of one, and a failed write leaves the old file as it was.

Every temporary name is ``<name>.askwright-tmp.<host>.<pid>[.<n>]``:
recognisably the bridge's and naming its writer, so what a writer killed
mid-write left can be told from what a live one is writing (``is_stray``)
and removed; the start sweeps the set folders for them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

TEMP_MARK = ".askwright-tmp."
# A temp file untouched this long is a dead writer's whoever wrote it (a
# write takes milliseconds, an upload writes every megabyte), also one from
# another machine sharing the folder, whose processes cannot be asked after.
STRAY_SECONDS = 300.0
# At most a DNS label long: a media name of 128 characters with its temporary tail stays a legal file name.
HOST = socket.gethostname().replace(".", "-").replace("/", "-")[:63] or "host"


def temp_path(path: Path, *, unique: bool = False) -> Path:
    """The temporary name beside ``path``; ``unique`` for a writer that may
    write the same name twice at once (two uploads of one file)."""
    tail = f".{uuid.uuid4().hex[:12]}" if unique else ""
    return path.with_name(f"{path.name}{TEMP_MARK}{HOST}.{os.getpid()}{tail}")


def replace_whole(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Make ``data`` the content of ``path``, atomically and durably, as a
    file of ``mode`` (0o600 for a secret; by default the mode and group the
    file has, or 0o644 for a new one).  On any failure the temporary file is
    removed and the error raised."""
    part = TempFile(path, mode=mode)
    try:
        part.write(data)
        part.commit()
    except BaseException:
        part.discard()
        raise


def _keep_access(fd: int, path: Path) -> None:
    """The file replacing ``path`` as readable as it was: its mode and group
    (an agent's questions.json of 0600 or 0660 was made 0644 by a close, for
    anyone on the machine to read).  A new file keeps 0644 less the umask."""
    try:
        was = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(was.st_mode):
        return
    with contextlib.suppress(OSError):  # a group this user is not in
        os.fchown(fd, -1, was.st_gid)
    os.fchmod(fd, stat.S_IMODE(was.st_mode))


class TempFile:
    """A file written in pieces under a temporary name beside ``path`` and
    renamed over it once whole and on disk.  ``temp``: a fixed temporary
    name of the caller's instead (one a retry truncates)."""

    def __init__(self, path: Path, *, temp: Path | None = None, unique: bool = False, mode: int | None = None):
        self.path = path
        self.temp = temp or temp_path(path, unique=unique)
        self.renamed = False  # the file is under its name (``commit`` got that far)
        # O_NOFOLLOW: a symlink planted at the temporary name is never written through.
        self._fd: int | None = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                                       | getattr(os, "O_NOFOLLOW", 0), 0o644 if mode is None else mode)
        if mode is None:
            _keep_access(self._fd, path)

    def write(self, data: bytes) -> None:
        assert self._fd is not None
        write_all(self._fd, data)

    def commit(self) -> None:
        """fsync, rename over the name (over a symlink of that name, the link
        itself is replaced, never its target), fsync the folder."""
        assert self._fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.replace(self.temp, self.path)
        self.renamed = True
        sync_dir(self.path.parent)

    def discard(self) -> None:
        """Nothing left of an unfinished write (safe to call more than once)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temp)


async def in_thread(work: Callable[..., T], *args: Any) -> T:
    """``work`` (a TempFile's write or commit) in a thread: a slow disk never
    holds the event loop.  Cancelled, it still waits for the thread, so a
    temporary file is never discarded (its descriptor closed, and maybe
    reused by another open) under a write."""
    task = asyncio.ensure_future(asyncio.to_thread(work, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def sync_dir(folder: Path) -> None:
    """The folder's entries on disk: a rename or a new file in it survives a power cut."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writer_of(name: str) -> tuple[str, int] | None:
    """(host, pid) of a temporary name ``temp_path`` made; None for any
    other name, whatever it holds (an agent's ``notes.askwright-tmp.txt``)."""
    stem, mark, tail = name.rpartition(TEMP_MARK)
    parts = tail.split(".")
    if not stem or not mark or len(parts) not in (2, 3) or not parts[0] \
            or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    if len(parts) == 3 and not (len(parts[2]) == 12 and all(c in "0123456789abcdef" for c in parts[2])):
        return None
    return parts[0], int(parts[1])


def is_stray(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a temporary file (or folder) a writer that is
    gone left: one of this machine once its process is gone, any once it
    is ``STRAY_SECONDS`` old (unchanged that long: a write takes
    milliseconds, an upload writes every megabyte; and a process id is used
    again after a restart, in a container pid 1 again); never one this
    process is writing, nor a name that is not of ``temp_path``'s form."""
    writer = writer_of(entry.name)
    if writer is None:
        return False
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > STRAY_SECONDS:
            return True  # this process's own too: a restart keeps the host and may get the same pid (1, in a container)
    except FileNotFoundError:
        return False
    if writer[0] != HOST:
        return False
    pid = writer[1]
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False


def remove_stray_folders(parent: Path) -> list[str]:
    """Remove the temporary folders writers that are gone left in ``parent``
    (a set the agents' API was making, ``temp_path`` of its name); their names."""
    with os.scandir(parent) as entries:
        strays = [e.name for e in entries if e.is_dir(follow_symlinks=False) and is_stray(e)]
    for name in strays:
        shutil.rmtree(parent / name, ignore_errors=True)
    return strays
