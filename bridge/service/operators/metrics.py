"""Prometheus metrics (served at /metrics by ``health``).

Everything lives on a private ``CollectorRegistry`` held by one ``Metrics``
object, so two bridges (or two tests) in one process never share counters,
and the exposition carries the bridge's metrics only, not the process-wide
defaults of whatever else imported prometheus-client.

The pipeline and the transports only call the ``observe_*`` methods and
``mark_ready``; each is cheap and never raises, because losing a sample is
better than losing an answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


# answers.json writes are one locked fsync'd replace: milliseconds normally,
# seconds on a struggling disk.
_WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped outside the bridge's event loop
        return 0.0


class Metrics:
    """The bridge's counters, and whether it is ready (has handled its first
    sync or transaction)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.questions_posted = Counter("askwright_bridge_questions_posted", "Question revisions posted to a room.",
                                        registry=r)
        self.answers_accepted = Counter("askwright_bridge_answers_accepted", "Answers accepted into answers.json.",
                                        registry=r)
        self.answers_refused = Counter("askwright_bridge_answers_refused", "Answers refused, by layer and reason.",
                                       ["layer", "reason"], registry=r)
        self.events_processed = Counter("askwright_bridge_events_processed",
                                        "Room events handed to the pipeline.", registry=r)
        self.sync_lag = Gauge("askwright_bridge_sync_lag_seconds",
                              "Now minus origin_server_ts of the newest event handled.", registry=r)
        self.errors = Counter("askwright_bridge_errors", "Errors and warnings, by where they happened.", ["where"],
                              registry=r)
        self.answers_write = Histogram("askwright_bridge_answers_write_seconds",
                                       "Time to write one set's answers.json (lock, replace, fsync).",
                                       buckets=_WRITE_BUCKETS, registry=r)
        self.ready_gauge = Gauge("askwright_bridge_ready", "1 once the first sync or transaction is handled.",
                                 registry=r)
        self._heard_at: float | None = None
        # Since when batches of events fail to be made durable, and the last
        # failure's words; None while they are made durable.
        self.failing: tuple[float, str] | None = None
        # Appservice mode: since when the homeserver's ping of the bridge
        # fails (no push reaches it), and why; None once one got through.
        self.unreached: tuple[float, str] | None = None
        self.failing_gauge = Gauge("askwright_bridge_batches_failing_seconds",
                                   "Seconds since batches of events stopped being made durable (0 when they are).",
                                   registry=r)
        self.failing_gauge.set_function(lambda: self.failing_seconds)
        # Bot mode: a homeserver that stopped answering (nio retries without
        # end, so nothing else says so).  NaN in appservice mode, where an idle
        # homeserver pushes nothing.
        self.silent = Gauge("askwright_bridge_homeserver_silent_seconds",
                            "Bot mode: seconds since a sync last came back (a long poll returns within 30 s).",
                            registry=r)
        self.silent.set_function(lambda: float("nan") if self.silent_seconds is None else self.silent_seconds)
        self.held_back = Counter("askwright_bridge_held_back",
                                 "Things held back or set aside, by kind (event, set, notice, download) and reason.",
                                 ["kind", "reason"], registry=r)
        self.sets_held = Gauge("askwright_bridge_sets_held", "Sets whose answers.json can't be written now.",
                               registry=r)
        # Counted when scraped: a count that keeps growing is a leak (the soak benchmark watches it).
        self.tasks = Gauge("askwright_bridge_asyncio_tasks", "asyncio tasks alive in the bridge's event loop.",
                           registry=r)
        self.tasks.set_function(_task_count)
        self.standby = Gauge("askwright_bridge_standby",
                             "1 while this instance stands by (another one leads the shared store), else 0.",
                             registry=r)
        # "leader" or "standby" on a shared PostgreSQL store; None when the bridge runs alone.
        self._role: str | None = None
        self._leading: Callable[[], bool] | None = None  # ``follow_lease``
        self._ready = False
        # What is held back (``heldback.counts``), for /health; None when
        # nothing reads the store for it.  Read off the event loop every
        # second (``Operators``): /health never waits for the database.
        self.held_now: dict[str, int] | None = None
        # Each supervised background task's state (``Supervisor.view``), for /health.
        self.tasks_view: Callable[[], dict[str, dict[str, Any]]] | None = None
        # Rooms the bridge was kicked or banned from (``Pipeline.removed``), for /health.
        self.rooms_removed: Callable[[], dict[str, dict[str, Any]]] | None = None
        # A shared store's lease: (seconds, error) while its database can't be reached, else None.
        self.store_trouble: Callable[[], tuple[float, str] | None] | None = None

    # -- what the bridge reports ---------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready and (self._leading is None or self._leading())

    @property
    def role(self) -> str | None:
        if self._leading is not None:
            return "leader" if self._leading() else "standby"
        return self._role

    def follow_lease(self, leading: Callable[[], bool]) -> None:
        """A leader's metrics: its role and readiness are the lease's as it is
        now, so /health says standby (503) the moment the lease is lost or runs
        out, not once the bridge has wound down (which waits for whatever was
        stuck on the database that cost it the lease)."""
        self._leading = leading
        self.standby.set_function(lambda: 0 if leading() else 1)
        self.ready_gauge.set_function(lambda: 1 if self.ready else 0)

    def mark_ready(self) -> None:
        if not self._ready:
            self._ready = True
            self.ready_gauge.set(1)

    def set_role(self, role: str) -> None:
        self._role = role
        self.standby.set(1 if role == "standby" else 0)

    def mark_not_ready(self) -> None:
        self._ready = False
        self.ready_gauge.set(0)

    def observe_posted(self, _question: Any = None) -> None:
        """One question posted (takes the poster's RecordedQuestion, or nothing)."""
        self.questions_posted.inc()

    def observe_outcome(self, entry: Any) -> None:
        """One answer-log entry (the store's LogEntry: outcome, layer, reason)."""
        outcome = getattr(entry, "outcome", None)
        if outcome == "accepted":
            self.answers_accepted.inc()
        elif outcome == "refused":
            self.answers_refused.labels(layer=getattr(entry, "layer", None) or "unknown",
                                        reason=getattr(entry, "reason", None) or "unknown").inc()

    def observe_batch(self, events: Iterable[Any]) -> None:
        """A batch of room events about to be processed: counts them and sets
        the lag from the newest ``origin_server_ts`` among them.  An empty
        batch leaves the lag as it was (nothing newer was handled)."""
        count = 0
        newest = None
        for event in events:
            count += 1
            ts = event.get("origin_server_ts") if isinstance(event, dict) else None
            if isinstance(ts, int) and not isinstance(ts, bool) and (newest is None or ts > newest):
                newest = ts
        self.events_processed.inc(count)
        if newest is not None:
            self.sync_lag.set(max(0.0, self.clock() - newest / 1000))

    def observe_write(self, seconds: float) -> None:
        self.answers_write.observe(max(0.0, seconds))

    def observe_trouble(self, kind: str, reason: str) -> None:
        self.held_back.labels(kind=kind, reason=reason).inc()

    def note_held(self, found: dict[str, int]) -> None:
        self.held_now = found
        self.sets_held.set(found.get("sets_held", 0))

    def batch_ended(self, failure: BaseException | None) -> None:
        """A batch of events made durable (None), or not, and why (any thread)."""
        if failure is None:
            self.failing = None
        else:
            since = self.failing[0] if self.failing is not None else self.clock()
            self.failing = (since, _said(failure))

    @property
    def failing_seconds(self) -> float:
        failing = self.failing
        return 0.0 if failing is None else max(0.0, self.clock() - failing[0])

    def not_reached(self, why: str) -> None:
        """Appservice mode: the homeserver's ping of the bridge failed."""
        since = self.unreached[0] if self.unreached is not None else self.clock()
        self.unreached = (since, why)

    def reached(self) -> None:
        """Appservice mode: a ping or a transaction came through."""
        self.unreached = None

    def listening(self) -> None:
        """Bot mode, at start: the silence counts from now until a first sync comes back."""
        if self._heard_at is None:
            self._heard_at = self.clock()

    def heard(self) -> None:
        """Bot mode: a sync came back (a long poll returns at least every 30 s)."""
        self._heard_at = self.clock()

    @property
    def silent_seconds(self) -> float | None:
        """Since the homeserver last answered a sync (or bot mode started); None in appservice mode."""
        return None if self._heard_at is None else max(0.0, self.clock() - self._heard_at)

    def observe_error(self, where: str) -> None:
        self.errors.labels(where=where or "unknown").inc()

    def error_counter(self, where: str | None = None) -> logging.Handler:
        """A logging handler counting every WARNING and above into errors_total,
        labelled ``where``, or else with the logger's last name part (``bot``,
        ``pipeline``, ``poster``, ``app``, ``appservice``): every place that
        already logs a failure is counted without another call."""
        return _ErrorCounter(self, where)

    # -- exposition ------------------------------------------------------------

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ErrorCounter(logging.Handler):
    def __init__(self, metrics: Metrics, where: str | None = None):
        super().__init__(level=logging.WARNING)
        self.metrics = metrics
        self.where = where

    def emit(self, record: logging.LogRecord) -> None:
        self.metrics.observe_error(self.where or record.name.rsplit(".", 1)[-1])


def _said(failure: BaseException) -> str:
    """A failure in one line, short: what /health shows of it."""
    words = " ".join(str(failure).split()) or type(failure).__name__
    return words[:200]
