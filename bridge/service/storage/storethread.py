"""The store's own thread, and one user of its connection at a time.

A store call blocks until the database answers: on PostgreSQL a network
round trip each, and a batch makes dozens.  Run on the event loop, that
stops everything else the loop serves (``/health``, the agents' API) for
as long.  So the heavy store work (a batch of events, the notices' reads and
marks, the held-back counts, a checkpoint) runs as a *job* on the store's
one worker thread (``run``), awaited, while the loop goes on.

One connection, two threads: every statement first takes the connection
(``_Gated``).  The worker holds it for a whole job; the event loop's thread
holds it from its first statement to the end of its current step (its next
``await``): what a coroutine does with the store between two awaits stays
one piece, as it was when the loop was the store's only user, and a job
never lands inside a transaction the loop has open (transactions never span
an await).  A thread without an event loop holds it for one statement.  So
the connection is never used by two threads at once, and a store call left
on the loop stays correct: while a job runs it waits for the job to end
(that blocks the loop, which is why the calls made while answers flow are
jobs).  Jobs start only in the order they were asked for.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class StoreThread:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread holding the connection now
        self._worker: ThreadPoolExecutor | None = None  # started by the first job
        self._soon_pending = False  # ``soon``

    def gated(self, db: Any) -> "_Gated":
        return _Gated(db, self)

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as a job on the store's thread, awaited.

        A cancelled await does not stop the job: it runs to its end (a batch
        stays whole) and ``close`` waits for it."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        return await asyncio.get_running_loop().run_in_executor(
            self._worker, functools.partial(self._job, fn, *args, **kwargs))

    def _job(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            self._holder = threading.get_ident()
            try:
                return fn(*args, **kwargs)
            finally:
                self._holder = None

    def take(self) -> bool:
        """Before a statement: this thread holds the connection (see the
        module).  True when it is to be given back right after the statement."""
        me = threading.get_ident()
        if self._holder == me:
            return False
        self._lock.acquire()
        self._holder = me
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return True
        loop.call_soon(self._step_over, me)
        return False

    def give_back(self) -> None:
        self._holder = None
        self._lock.release()

    def _step_over(self, holder: int) -> None:
        if self._holder == holder:
            self.give_back()

    def soon(self, fn: Callable[[], None]) -> None:
        """``fn`` holding the connection: now when this thread holds it (a
        job), else as a job of its own, not waited for (one at a time): for
        a round trip nobody needs the answer of now, which must not stall
        the event loop when the database does."""
        if self._holder == threading.get_ident():
            fn()
            return
        if self._soon_pending or self._worker is None:
            return  # (no job ever ran: nothing needs it yet)
        self._soon_pending = True

        def once() -> None:
            try:
                fn()
            finally:
                self._soon_pending = False

        try:
            self._worker.submit(self._job, once)
        except RuntimeError:  # closed meanwhile
            self._soon_pending = False

    def close(self) -> None:
        """Wait for the jobs asked for; the caller closes the connection next."""
        if self._holder == threading.get_ident():
            self.give_back()  # a job waiting for this step's hold could not end otherwise
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None


class _Gated:
    """A connection (sqlite3's, or ``PgConnection``) whose statements each
    first take it for their thread (``StoreThread.take``).  Everything else
    (attributes, ``fence``, ``close``) is the connection's own."""

    def __init__(self, db: Any, thread: StoreThread):
        self.__dict__.update(_db=db, _thread=thread)

    def execute(self, sql: str, params: Any = ()) -> Any:
        once = self._thread.take()
        try:
            return self._db.execute(sql, params)
        finally:
            if once:
                self._thread.give_back()

    def executemany(self, sql: str, rows: Any) -> Any:
        once = self._thread.take()
        try:
            return self._db.executemany(sql, rows)
        finally:
            if once:
                self._thread.give_back()

    def defer(self, sql: str, params: Any = ()) -> None:
        """A write whose result nobody reads: on PostgreSQL sent with the next
        statement that waits (``PgConnection.defer``), on SQLite at once."""
        once = self._thread.take()
        try:
            send = getattr(self._db, "defer", None)
            if send is not None:
                send(sql, params)
            else:
                self._db.execute(sql, params)
        finally:
            if once:
                self._thread.give_back()

    def reads(self, statements: Any, *, commit: bool = False) -> list[list[tuple]]:
        """The rows of each read: on PostgreSQL all sent at once (one round
        trip, ``PgConnection.reads``), on SQLite one after the other.
        ``commit``: then the transaction's COMMIT (with them on PostgreSQL)."""
        once = self._thread.take()
        try:
            send = getattr(self._db, "reads", None)
            if send is not None:
                return send(statements, commit=commit)
            rows = [self._db.execute(sql, params).fetchall() for sql, params in statements]
            if commit:
                self._db.execute("COMMIT")
            return rows
        finally:
            if once:
                self._thread.give_back()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._db, name, value)


def loop_side(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` (which touches the event loop's objects: sets an ``asyncio.Event``)
    made callable from a job too: called from another thread, it runs on the
    loop that was running where ``loop_side`` was called.  Without a running
    loop, ``fn`` itself."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return fn
    home = threading.get_ident()

    def call() -> None:
        if threading.get_ident() == home:
            fn()
        else:
            loop.call_soon_threadsafe(fn)
    return call
