"""The supervisor: a background task that raises is logged, counted,
started again after its backoff and shown in /health (served for real);
one that returns is finished; stopping ends the restarts."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from bridge.service.operators.health import health_app
from bridge.service.operators.metrics import Metrics
from bridge.service.supervisor import FINISHED, RESTARTING, RUNNING, STOPPED, Supervisor


async def health_of(base: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/health") as response:
            return await response.json()


async def test_a_task_that_raises_is_restarted_counted_and_shown_in_health(caplog) -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics.registry, first_delay=0.3)
    metrics.tasks_view = supervisor.view
    metrics.mark_ready()
    runner = web.AppRunner(health_app(metrics))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    stop = asyncio.Event()
    runs: list[int] = []
    again = asyncio.Event()

    async def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise OSError(5, "the disk went away")
        again.set()
        await stop.wait()

    caplog.set_level(logging.WARNING, logger="bridge.service.supervisor")
    try:
        task = supervisor.spawn("flaky", flaky, stop)
        await asyncio.sleep(0.1)
        seen = (await health_of(base))["tasks"]["flaky"]
        assert seen["state"] == RESTARTING and seen["restarts"] == 1
        assert "the disk went away" in seen["last_error"]
        await asyncio.wait_for(again.wait(), 10)
        seen = (await health_of(base))["tasks"]["flaky"]
        assert seen["state"] == RUNNING and seen["restarts"] == 1
        assert 'askwright_bridge_task_restarts_total{task="flaky"} 1.0' in metrics.exposition().decode()
        assert any("flaky failed" in r.getMessage() and r.exc_info for r in caplog.records)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert supervisor.view()["flaky"]["state"] == STOPPED and len(runs) == 2
    finally:
        stop.set()
        await supervisor.close()
        await runner.cleanup()


async def test_a_task_that_returns_is_finished_and_one_failing_while_stopping_is_not_restarted() -> None:
    supervisor = Supervisor(first_delay=0.05)
    stop = asyncio.Event()
    calls: list[str] = []

    async def done() -> None:
        calls.append("done")

    async def fails_on_stop() -> None:
        calls.append("stopping")
        await stop.wait()
        raise RuntimeError("closing the connection failed")

    await supervisor.spawn("done", done, stop)
    task = supervisor.spawn("stopping", fails_on_stop, stop)
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert calls == ["done", "stopping"]
    assert supervisor.view()["done"]["state"] == FINISHED
    assert supervisor.view()["stopping"]["state"] == STOPPED


async def test_the_backoff_doubles_between_restarts() -> None:
    supervisor = Supervisor(first_delay=0.05, max_delay=0.2)
    stop = asyncio.Event()
    times: list[float] = []
    loop = asyncio.get_running_loop()

    async def always_fails() -> None:
        times.append(loop.time())
        raise ValueError("bad input")

    supervisor.spawn("broken", always_fails, stop)
    while len(times) < 5:
        await asyncio.sleep(0.02)
    stop.set()
    await supervisor.close()
    gaps = [b - a for a, b in zip(times, times[1:])]
    # Sleeps never end early: each gap is at least its delay (0.05, 0.1, then the 0.2 cap).
    assert [g >= d * 0.99 for g, d in zip(gaps, (0.05, 0.1, 0.2, 0.2))] == [True] * 4
    assert supervisor.view()["broken"]["restarts"] >= 4


async def test_ask_status_names_a_task_that_failed_and_leaves_healthy_ones_out(tmp_path) -> None:
    from bridge.service.operators.admin import AdminContext, Command, handle
    from bridge.service.storage.store import Store

    supervisor = Supervisor(first_delay=30)
    stop = asyncio.Event()
    quiet = asyncio.Event()

    async def broken() -> None:
        raise KeyError("no such room")

    async def fine() -> None:
        await quiet.wait()

    supervisor.spawn("reminders", broken, stop)
    supervisor.spawn("commands", fine, stop)
    await asyncio.sleep(0.05)
    store = Store(tmp_path / "store.sqlite")

    async def nothing(*_args):
        return ""

    ctx = AdminContext(admins=frozenset({"@admin:hs"}), sets_root=tmp_path, store=store, post_set=nothing,
                       remind_set=nothing, tasks=supervisor.view)
    try:
        reply = await handle(Command("status"), "@admin:hs", ctx)
        assert "task reminders: restarting, restarted 1 time (last error: KeyError: 'no such room')" in reply
        assert "commands" not in reply
    finally:
        stop.set()
        quiet.set()
        await supervisor.close()
        store.close()
