"""``kill -USR2`` writes what each of the bridge's tasks waits on into its
log, down to the innermost await: a bridge that stays up but stops making
answers durable logs nothing otherwise."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from bridge.service.operators import taskdump


async def _waits_for_a_while(event: asyncio.Event) -> None:
    await event.wait()


async def test_sigusr2_logs_each_task_down_to_its_innermost_await(caplog) -> None:
    loop = asyncio.get_running_loop()
    taskdump.install(loop)
    try:
        event = asyncio.Event()
        waiting = asyncio.ensure_future(_waits_for_a_while(event), loop=loop)
        waiting.set_name("the-waiting-one")
        await asyncio.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="bridge.service.operators.taskdump"):
            os.kill(os.getpid(), signal.SIGUSR2)
            await asyncio.sleep(0.05)
        text = caplog.text
        assert "task the-waiting-one:" in text
        mine = text.split("task the-waiting-one:")[1]
        assert "in _waits_for_a_while" in mine and "locks.py" in mine and "in wait" in mine
        event.set()
        await waiting
    finally:
        loop.remove_signal_handler(signal.SIGUSR2)
