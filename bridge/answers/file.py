"""Reading and writing a set folder's ``answers.json``: the only writer code.

Two promises, to the bridge and to anyone else who writes the folder (the
askwright server, a script):

* Writers serialise on an exclusive ``fcntl.flock`` of ``<set>/.answers.lock``
  and read-modify-write only while holding it, so no update is lost.
* The file is only ever replaced whole (temp file in the same folder, fsync,
  ``os.replace``, fsync of the folder), so a reader never sees a torn file
  and needs no lock, and a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bridge.answers import document
from bridge.answers.document import utc_of_ms
from bridge.regularfile import read_regular
from bridge.wholefile import TEMP_MARK, is_stray, replace_whole

ANSWERS_NAME = "answers.json"
LOCK_NAME = ".answers.lock"
# answers.json being replaced is first written beside it under this name
# and the writer's (``bridge.wholefile``), so what a killed writer left
# behind can be told and removed (``remove_stray_temps``).
TEMP_PREFIX = ANSWERS_NAME + TEMP_MARK

Doc = dict[str, Any]


class AnswersFile:
    """The ``answers.json`` of one set folder."""

    def __init__(self, set_dir: str | os.PathLike[str], set_id: str | None = None):
        self.set_dir = Path(set_dir)
        # The id an empty document gets; the folder's name is the usual id
        # (askwright keeps a set in a folder named after it).
        self.set_id = set_id or self.set_dir.resolve().name
        self.path = self.set_dir / ANSWERS_NAME
        self.lock_path = self.set_dir / LOCK_NAME

    @contextlib.contextmanager
    def locked(self, *, wait: bool | float = True) -> Iterator[None]:
        """Hold the folder's writer lock.  Not re-entrant: flock on a second
        descriptor blocks even within one process, so never nest it.
        ``wait=False``: BlockingIOError at once when another holds it; a
        number: after that many seconds (``LockBusy``)."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if wait is True:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                _flock_within(fd, float(wait))
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def read_bytes(self) -> bytes | None:
        """The file's bytes, or None when there is no file yet.

        One read of one open file: since writers only rename a complete file
        over this name, what is read is always some whole version.
        """
        try:
            return read_regular(self.path)  # (a FIFO under the name would hold the reader: ``regularfile``)
        except FileNotFoundError:
            return None

    def load(self) -> Doc:
        """The current document (an empty one when nothing is written yet);
        ``document.AnswersError`` when the file breaks the format."""
        data = self.read_bytes()
        if data is None:
            return document.empty(self.set_id)
        return document.parse(data)

    def update(self, fn: Callable[[Doc, str], Doc], now: str, *, lock_wait: bool | float = True) -> Doc:
        """Under the lock: load, ``fn(doc, now)``, write the result; return it.

        ``fn`` returns the document unchanged to write nothing, or one whose
        ``rev`` is exactly one more (``document.put_record`` and
        ``drop_record`` do this).  Anything else is refused before the disk
        is touched, so ``rev`` always counts the writes.  Like the functions
        of ``document``, ``fn`` must not change the document it is given:
        the document written is kept for the next update of the set.
        """
        with self.locked(wait=lock_wait):
            key = os.path.abspath(self.path)
            data = self.read_bytes()
            kept = _kept(key, data)
            if kept is not None:
                current, fragments = kept.doc, kept.fragments
            else:
                current = document.empty(self.set_id) if data is None else document.parse(data)
                fragments = {}
            new = fn(current, later_than(now, current.get("updated")))
            if new is current or new == current:
                if new is current:
                    _forget(key)  # in case ``fn`` changed it in place after all
                return current
            if new.get("rev") != current["rev"] + 1:
                raise document.AnswersError(
                    f"an update must raise rev by one ({current['rev']} -> {current['rev'] + 1}), got {new.get('rev')!r}"
                )
            # Never write what the next reader would refuse: ``current`` was
            # checked when it was read, so only what changed is checked again.
            document.check_changed(new, current)
            data = document.dumps_reusing(new, fragments)
            self._replace(data)
            _keep(key, _Kept(data, new, fragments))
            return new

    def _replace(self, data: bytes) -> None:
        replace_whole(self.path, data)


def later_than(now: str, before: Any) -> str:
    """``now``, or a millisecond past the document's last ``updated`` when it
    is no later: an agent waiting for answers ``after`` the last one's time
    missed one written within the same millisecond (or once the clock
    stepped back), its ``updated`` equal, not later."""
    now_ms, before_ms = _ms(now), _ms(before)
    if now_ms is None or before_ms is None or now_ms > before_ms:
        return now
    return utc_of_ms(before_ms + 1)


def _ms(text: Any) -> int | None:
    """Milliseconds of an ``updated`` as the bridge writes it; None for anything else."""
    try:
        return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except (AttributeError, TypeError, ValueError):
        return None


# The last document each recent writer wrote or read, with the bytes it was
# in: the next update of that set (under the lock) re-reads the file, which
# is cheap, and re-parses it only when the bytes differ, i.e. when another
# writer changed it meanwhile.  Parsing and checking a large answers.json
# costs far more than writing one answer into it.  Bounded, so a bridge with
# thousands of sets keeps only the busy ones.
@dataclass
class _Kept:
    data: bytes
    doc: Doc
    fragments: document.Fragments


_KEEP = 128
_kept_docs: OrderedDict[str, _Kept] = OrderedDict()


def _kept(key: str, data: bytes | None) -> _Kept | None:
    kept = _kept_docs.get(key)
    if kept is None or data is None or kept.data != data:
        return None
    _kept_docs.move_to_end(key)
    return kept


def _keep(key: str, kept: _Kept) -> None:
    _kept_docs[key] = kept
    _kept_docs.move_to_end(key)
    while len(_kept_docs) > _KEEP:
        _kept_docs.popitem(last=False)


def _forget(key: str) -> None:
    _kept_docs.pop(key, None)


class LockBusy(BlockingIOError):
    """Another process held the set's writer lock for longer than the wait."""


def _flock_within(fd: int, seconds: float) -> None:
    """The lock within ``seconds`` (0: one try), or LockBusy.  A writer paused
    while it holds the lock (SIGSTOP, a frozen VM) holds it until it runs
    again: whoever waits for it must not wait with it."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockBusy(errno.EWOULDBLOCK, "another process holds the set's lock") from None
            time.sleep(0.01)


def remove_stray_temps(set_dir: str | os.PathLike[str], *, wait: bool = True) -> list[str]:
    """Under the set's lock, remove the temp files writers that died (kill -9,
    a power cut) left in ``set_dir``; returns their names.  One a live writer
    may still hold is kept: a temp file of this machine is removed once its
    process is gone, one of another machine once it is ``STRAY_SECONDS`` old.
    ``wait=False``: nothing is done (and [] returned) while another holds the lock."""
    if not _strays(Path(set_dir)):
        return []  # the usual case, and no lock file made in a folder that is no set
    try:
        with AnswersFile(set_dir).locked(wait=wait):
            return [name for name in _strays(Path(set_dir)) if _unlink(Path(set_dir) / name)]
    except BlockingIOError:  # flock's answer when the lock is held and wait is False
        return []


def _strays(folder: Path) -> list[str]:
    with os.scandir(folder) as entries:
        return [e.name for e in entries if e.is_file(follow_symlinks=False) and is_stray(e)]


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
