"""The store's own thread (``storethread``): a job holds the connection
for the whole of its work, so neither the event loop nor another thread
ever reads or writes inside a job's open transaction; they wait for its end."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from bridge.service.storage.store import Store


def _half_written(store: Store, inside: threading.Event, release: threading.Event) -> None:
    """A job: one transaction, paused half way until ``release``."""
    with store.transaction():
        store.set_meta("k", "half")
        inside.set()
        assert release.wait(10)
        store.set_meta("k", "whole")


async def test_the_event_loop_reads_after_a_job_not_inside_its_transaction(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    inside, release = threading.Event(), threading.Event()
    job = asyncio.ensure_future(store.run(_half_written, store, inside, release))
    assert await asyncio.to_thread(inside.wait, 10)  # the loop is free while the job runs
    threading.Timer(0.2, release.set).start()
    # On the loop, with the job half way: the read waits for its commit.
    assert store.get_meta("k") == "whole"
    await job
    store.close()


async def test_a_thread_without_an_event_loop_waits_for_the_job_too(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    inside, release = threading.Event(), threading.Event()
    job = asyncio.ensure_future(store.run(_half_written, store, inside, release))
    assert await asyncio.to_thread(inside.wait, 10)
    threading.Timer(0.2, release.set).start()
    assert await asyncio.to_thread(store.get_meta, "k") == "whole"
    await job
    store.close()
