"""The bridge's own "a set changed" feed: in-process publish and subscribe.

The places that already know when a set changes publish to it: the
pipeline after it writes a set's answers.json, the folder watcher when a
questions.json changes, the agents' service layer after it writes a set,
and the answers watcher (answers.json written by anyone else).  Waiting
agents subscribe to it instead of each watching the folder: a subscription
is an ``asyncio.Event``, with no watcher, no thread and no descriptor of its
own, so thousands of waits cost a few kilobytes.

A change names a set folder; it says only that something in it changed, and
the subscriber reads the folder again.  Publishing is synchronous and cheap
(a dictionary look-up), so it can be called from the answers' path."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator


def folder_key(set_dir: str | os.PathLike[str]) -> str:
    """The one name of a set folder, whoever spells it (the poster records resolved paths)."""
    return os.path.realpath(set_dir)


class Changes:
    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None
        self.closed = False

    def publish(self, set_dir: str | os.PathLike[str]) -> None:
        """Wake every subscriber of ``set_dir``.  Safe from any thread."""
        if not self._subscribers:
            return
        if self._loop is not None and threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._wake, folder_key(set_dir))
            return
        self._wake(folder_key(set_dir))

    def _wake(self, key: str) -> None:
        for event in self._subscribers.get(key, ()):
            event.set()

    def close(self) -> None:
        """The bridge stops: every subscriber is woken and sees ``closed``."""
        self.closed = True
        for events in self._subscribers.values():
            for event in events:
                event.set()

    @contextlib.contextmanager
    def subscribe(self, set_dir: str | os.PathLike[str]) -> Iterator[asyncio.Event]:
        """An event set on each change of ``set_dir`` (the subscriber clears it before reading again)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()
        key = folder_key(set_dir)
        event = asyncio.Event()
        if self.closed:
            event.set()
        self._subscribers.setdefault(key, set()).add(event)
        try:
            yield event
        finally:
            events = self._subscribers.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._subscribers[key]

    def subscribers(self) -> int:
        return sum(len(events) for events in self._subscribers.values())
