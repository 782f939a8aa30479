"""The store's statements made on the event loop's thread (the main one):
each waits for the database while /health, the rooms and the agents wait."""

from __future__ import annotations

import threading
from typing import Any


def statements_on_the_loop(store: Any) -> list[str]:
    """Watch ``store``'s connection from now on; the list fills with the
    first words of each statement the main thread makes."""
    on_loop: list[str] = []

    class Watched:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                on_loop.append(" ".join(sql.split()[:4]))
            return self.inner.execute(sql, *args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    store.db = Watched(store.db)
    return on_loop
