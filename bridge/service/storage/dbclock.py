"""The one clock for times another instance reads: the store's.

A time written to the store and compared by another instance (a webhook's
next try, when an undecryptable event was first seen, a held set's next
try, a posting's age) must come from a clock both agree on.  On
PostgreSQL that is the database's: ``DatabaseClock`` measures the server's
``clock_timestamp()`` at each connect and about once a minute, and runs on
from there by this machine's elapsed time, so a machine whose wall clock is
off (or is stepped) neither retries late nor gives up early.  No round trip
per reading: the clock is read on the event loop and on the store's thread.  SQLite has one machine,
so its clock is the wall clock (``LocalClock``).

Both tell milliseconds since the epoch (``now_ms``) and seconds
(``seconds``), the two forms the modules that take a ``clock`` use."""

from __future__ import annotations

import time
from typing import Any, Callable

# How often the offset to the database's clock is measured again.
REMEASURE_SECONDS = 60.0


def elapsed() -> float:
    """Seconds that keep running while the machine is suspended (CLOCK_BOOTTIME):
    ``time.monotonic`` stops then, and a leader resumed from a suspend would
    believe in a lease the database already gave away."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


class LocalClock:
    """This machine's wall clock (SQLite: one machine reads what it wrote)."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def seconds(self) -> float:
        return time.time()


class DatabaseClock:
    """The database's clock, read without a round trip (see the module)."""

    def __init__(self) -> None:
        self._db_ms: float | None = None  # the server's time when ...
        self._at = 0.0                    # ... ``elapsed`` read this
        # Set by the connection: measures again when that is safe (not
        # inside a transaction a failure would abort), else does nothing.
        self.refresh: Callable[[], None] | None = None

    def measure(self, conn: Any) -> None:
        """Anchor to the server's clock through ``conn`` (a psycopg connection,
        outside a transaction): the server's reading is taken as the middle
        of the round trip."""
        before = elapsed()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000").fetchone()
        after = elapsed()
        self._db_ms, self._at = float(row[0]), (before + after) / 2

    def now_ms(self) -> int:
        if (self._db_ms is None or elapsed() - self._at >= REMEASURE_SECONDS) and self.refresh is not None:
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the last anchor stays good for far longer than a minute
                pass
        if self._db_ms is None:  # never measured (no connection yet): the best there is
            return int(time.time() * 1000)
        return int(self._db_ms + (elapsed() - self._at) * 1000)

    def seconds(self) -> float:
        return self.now_ms() / 1000
