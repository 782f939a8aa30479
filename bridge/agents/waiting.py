"""``wait`` for agents: the semantics of ``askwright-bridge wait`` (until a
question or any open question is answered, or every open one; with a
timeout; with ``after``, only an answer later than the one last seen), as
a coroutine that reports progress while it waits.

A wait subscribes to the bridge's change feed (``changes``): it holds no
watcher and no thread, only an event, and reads the set again when the feed
says the set changed.  ``Waits`` (waitcap.py) caps how many are held, and
gives back the request a held wait was charged."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

from bridge.agents.errors import BadRequest, NotFound, Unprocessable
from bridge.agents.owner import read_owner
from bridge.agents.sets import AgentSets
from bridge.answers.arrival import (UNTIL_ALL, UNTIL_ANSWERED, arrived, as_read, has_answer, in_the_set, parse_time,
                                    unanswerable)

# One rule for both doors (HTTP and MCP): seconds, 0 to MAX_TIMEOUT, default
# DEFAULT_TIMEOUT; more is refused, not capped.
MAX_TIMEOUT = 300.0
DEFAULT_TIMEOUT = 60.0
# A wait with a shorter timeout is a read, and is charged as one: waits of
# a second, each given back, let an agent holding its max_waits make 100
# requests a second (each reading its set) on a budget of 2.
HELD_AT_LEAST = 10.0
# How often a wait looks again at a set whose files went missing.
MISSING_LOOK_EVERY = 1.0
Progress = Callable[[float, float, str], Awaitable[None]]


class Waited(NamedTuple):
    view: dict[str, Any]  # what ``read`` shows
    arrived: bool
    # Why what is awaited can get no answer now (closed, withdrawn,
    # superseded, none open): the wait ends at once, as ``wait`` exits 2,
    # where it held an agent until its timeout, again and again.
    unanswerable: str | None = None


def progress_of(view: dict[str, Any]) -> tuple[int, int]:
    """(answered, open): how many open questions have an answer now."""
    entries = [e for e in view["answers"] if e["status"] == "open"]
    return sum(1 for e in entries if has_answer(e)), len(entries)


def check_timeout(timeout: Any) -> float:
    """The one timeout rule of both doors."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout \
            or not 0 <= timeout <= MAX_TIMEOUT:
        raise BadRequest(f"timeout: must be a number of seconds from 0 to {MAX_TIMEOUT:.0f}")
    return float(timeout)


async def wait_answers(sets: AgentSets, agent: str, set_id: str, *, until: str = UNTIL_ANSWERED,
                       question: str | None = None, timeout: float = DEFAULT_TIMEOUT, include_all: bool = False,
                       after: str | None = None, progress: Progress | None = None,
                       gone: Callable[[], bool] | None = None) -> Waited:
    """What ``read`` shows, whether the answers arrived, and why they can't
    when they can't.  ``gone``: whether the waiter has left; the wait then
    ends and gives its place back."""
    if until not in (UNTIL_ANSWERED, UNTIL_ALL):
        raise BadRequest(f"until: must be {UNTIL_ANSWERED} or {UNTIL_ALL}")
    if question is not None and until == UNTIL_ALL:
        # Well formed, but not a wait there is: 422, over both doors.
        raise Unprocessable("question: until all waits for every open question; leave out the question")
    timeout = check_timeout(timeout)
    since = None
    if after is not None:
        since = parse_time(after) if isinstance(after, str) else None
        if since is None:
            raise BadRequest("after: must be the updated time of an answer (RFC 3339, such as 2026-05-01T12:00:00.000Z)")
    set_dir = sets.set_dir(agent, set_id)
    deadline = time.monotonic() + timeout
    # Subscribed before the first reading: a change between the two is not missed.
    with sets.changes.subscribe(set_dir) as changed:
        view = await sets.read_all_apart(agent, set_id)
        if question is not None and not in_the_set(view, question):
            raise Unprocessable(f"question: no question {question!r} in this set")
        done = arrived(view, question, until, since)
        await _report(progress, view)
        if not done and timeout > 0 and not sets.stopping() and unanswerable(view, question, until) is None:
            with sets.waits.hold(agent, changed, gone):
                if timeout >= HELD_AT_LEAST and sets.waits.give_back is not None:
                    sets.waits.give_back(agent)
                view, done = await _follow(sets, agent, set_id, changed, view, question, until, since,
                                           deadline, progress, gone)
    return Waited(as_read(view, include_all), done, None if done else unanswerable(view, question, until))


async def _follow(sets: AgentSets, agent: str, set_id: str, changed: asyncio.Event, view: dict[str, Any],
                  question: str | None, until: str, since: Any, deadline: float,
                  progress: Progress | None, gone: Callable[[], bool] | None) -> tuple[dict[str, Any], bool]:
    last = progress_of(view)
    set_dir = sets.set_dir(agent, set_id)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + max(0.0, deadline - time.monotonic())):
            missing = False
            while True:
                if missing:
                    # Files gone but the folder still there: an rm -r under
                    # way, whose last step no change is told for.  Looked at
                    # again each second until the set is whole or gone.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(MISSING_LOOK_EVERY):
                            await changed.wait()
                else:
                    await changed.wait()
                changed.clear()
                if sets.stopping() or (gone is not None and gone()):
                    break
                try:
                    view = await sets.read_all_apart(agent, set_id)
                except NotFound:
                    if not os.path.lexists(set_dir) or not _still_theirs(set_dir, agent):
                        # Removed (the bridge closes its questions), or another
                        # agent's now: nothing will come to end the wait, so it
                        # ends now, as ``askwright-bridge wait`` exits 2.
                        raise NotFound(f"no set {set_id!r}: it was removed while waiting") from None
                    missing = True  # mid-rewrite by its writer, or being removed
                    continue
                missing = False
                if arrived(view, question, until, since):
                    return view, True
                if unanswerable(view, question, until) is not None:
                    return view, False
                if progress_of(view) != last:
                    last = progress_of(view)
                    await _report(progress, view)
    return view, False


async def _report(progress: Progress | None, view: dict[str, Any]) -> None:
    if progress is None:
        return
    answered, total = progress_of(view)
    await progress(float(answered), float(max(total, 1)), f"{answered} of {total} open questions answered")


def _still_theirs(set_dir: Path, agent: str) -> bool:
    """The folder still ``agent``'s, or being rewritten (no owner file read
    this moment): a folder another agent's set took over is not."""
    owner = read_owner(set_dir)
    return owner is None or owner.agent == agent
