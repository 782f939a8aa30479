"""What every task of the bridge is waiting on, written to the log on SIGUSR2.

A bridge that stays up but stops making answers durable shows nothing in
its log (a wait that never ends logs nothing), and a stack dump of its
threads (py-spy, faulthandler) shows only an idle event loop.  The
coroutines' own chains of awaits say which wait it is: ``kill -USR2 <pid>``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Iterator

log = logging.getLogger(__name__)


def _awaits(coro: Any) -> Iterator[Any]:
    """The frames from a task's coroutine down to the innermost await
    (``Task.get_stack`` gives only the outermost one)."""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)


def task_stacks(tasks: set[asyncio.Task]) -> str:
    lines = []
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"task {task.get_name()}:")
        lines += [f"  {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}" for f in _awaits(task.get_coro())]
    return "\n".join(lines)


def install(loop: asyncio.AbstractEventLoop) -> None:
    loop.add_signal_handler(signal.SIGUSR2, lambda: log.warning(
        "what each task waits on (SIGUSR2):\n%s", task_stacks(asyncio.all_tasks(loop))))
