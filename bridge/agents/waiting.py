"""``wait`` for agents: the semantics of ``askwright-bridge wait`` (until a
question or any open question is answered, or every open one; with a
timeout), as a coroutine that reports progress while it waits.

The set folder is watched, not polled: it is read again only when
answers.json or questions.json changes (and on a slow tick, for the deadline)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from watchfiles import awatch

from bridge.agents.errors import BadRequest, NotFound, Unprocessable
from bridge.agents.sets import AgentSets
from bridge.answers.file import ANSWERS_NAME
from bridge.answers.arrival import UNTIL_ALL, UNTIL_ANSWERED, arrived, as_read, has_answer
from bridge.questionset.setdir import QUESTIONS_FILE

MAX_TIMEOUT = 3600.0
TICK_MS = 500

Progress = Callable[[float, float, str], Awaitable[None]]


def progress_of(view: dict[str, Any]) -> tuple[int, int]:
    """(answered, open): how many open questions have an answer now."""
    entries = [e for e in view["answers"] if e["status"] == "open"]
    return sum(1 for e in entries if has_answer(e)), len(entries)


async def wait_answers(sets: AgentSets, agent: str, set_id: str, *, until: str = UNTIL_ANSWERED,
                       question: str | None = None, timeout: float = 60.0, include_all: bool = False,
                       progress: Progress | None = None) -> tuple[dict[str, Any], bool]:
    """(what ``read`` shows, whether the answers arrived)."""
    if until not in (UNTIL_ANSWERED, UNTIL_ALL):
        raise BadRequest(f"until must be {UNTIL_ANSWERED} or {UNTIL_ALL}")
    if question is not None and until == UNTIL_ALL:
        raise BadRequest("until all waits for every open question; leave out the question")
    if not isinstance(timeout, (int, float)) or timeout != timeout or timeout < 0:
        raise BadRequest("timeout must be a number of seconds, 0 or more")
    timeout = min(float(timeout), MAX_TIMEOUT)
    set_dir = sets.set_dir(agent, set_id)
    view = sets.read_all(agent, set_id)
    if question is not None and all(e["qid"] != question for e in view["answers"]):
        raise Unprocessable(f"no question {question!r} in this set")
    deadline = time.monotonic() + timeout
    done = arrived(view, question, until)
    await _report(progress, view)
    if not done and timeout > 0:
        view, done = await _watch(sets, agent, set_id, set_dir, view, question, until, deadline, progress)
    return as_read(view, include_all), done


async def _watch(sets: AgentSets, agent: str, set_id: str, set_dir: os.PathLike[str], view: dict[str, Any],
                 question: str | None, until: str, deadline: float,
                 progress: Progress | None) -> tuple[dict[str, Any], bool]:
    names = {ANSWERS_NAME, QUESTIONS_FILE}
    # awatch sets the event it is given when it is cancelled (a client that
    # gave up its wait): this wait's own, never the bridge's stop.
    stop = asyncio.Event()
    follow = asyncio.ensure_future(sets.stop.wait()) if sets.stop is not None else None
    if follow is not None:
        follow.add_done_callback(lambda _f: stop.set())
    try:
        return await _watch_until(sets, agent, set_id, set_dir, view, question, until, deadline, progress,
                                  names, stop)
    finally:
        if follow is not None:
            follow.cancel()


async def _watch_until(sets: AgentSets, agent: str, set_id: str, set_dir: os.PathLike[str], view: dict[str, Any],
                       question: str | None, until: str, deadline: float, progress: Progress | None,
                       names: set[str], stop: asyncio.Event) -> tuple[dict[str, Any], bool]:
    first = True
    last = progress_of(view)
    async for changes in awatch(set_dir, watch_filter=lambda _c, path: os.path.basename(path) in names,
                                debounce=200, step=20, rust_timeout=TICK_MS, yield_on_timeout=True,
                                recursive=False, stop_event=stop):
        # The first wake-up re-reads: a write before the watcher started is not missed.
        if changes or first:
            first = False
            try:
                view = sets.read_all(agent, set_id)
            except NotFound:
                pass
            else:
                if arrived(view, question, until):
                    return view, True
                if progress_of(view) != last:
                    last = progress_of(view)
                    await _report(progress, view)
        if time.monotonic() >= deadline or stop.is_set():
            break
    return view, False


async def _report(progress: Progress | None, view: dict[str, Any]) -> None:
    if progress is None:
        return
    answered, total = progress_of(view)
    await progress(float(answered), float(max(total, 1)), f"{answered} of {total} open questions answered")
