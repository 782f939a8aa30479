"""One bridge per SQLite store: the running bridge holds an exclusive
``flock`` on ``<store.path>.lock`` for as long as it runs.

``store migrate`` takes the same lock, so it refuses while the bridge runs
(and a bridge refuses to start while the store is being copied).  The kernel
drops the lock when the process dies, however it dies.  A PostgreSQL store
needs no such file: its instances elect a leader in the database instead.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO


class StoreBusy(Exception):
    """Another process holds the store."""


def lock_path(store_path: str | Path) -> Path:
    return Path(f"{store_path}.lock")


def hold(store_path: str | Path) -> IO[bytes]:
    """Take the lock (without waiting); keep the returned file open while it is needed."""
    path = lock_path(store_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+b")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().decode(errors="replace").strip()
        handle.close()
        raise StoreBusy(f"{store_path} is in use by another process ({holder or 'pid unknown'})") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}".encode())
    handle.flush()
    return handle
