"""Reading a file someone else writes, without waiting on it.

A name in a set folder may be a FIFO or a device (an agent's mistake, or
someone's doing): opened as a file, it holds the reader until someone
writes into it, and a reader on the event loop (the poster, ``!ask
status``) froze the whole bridge.  So such files are opened without
waiting, and only a regular file is read."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


class NotRegular(OSError):
    """The name is there, but is no regular file (a FIFO, a device)."""


def read_regular(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit`` + 1, to
    tell a file over a limit); FileNotFoundError, NotRegular or any OSError."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        # Looked at before it is wrapped: a directory refused by ``open``
        # named the descriptor ("cannot read 3"), not the path.
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(descriptor)
        raise
    with open(descriptor, "rb") as handle:
        return handle.read() if limit is None else handle.read(limit + 1)
