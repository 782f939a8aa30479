"""An instance of a cluster outlives a failed term as leader: its store
failing to open while PostgreSQL restarts (seen in the failover storm: the
leader's process exited) hands the lease on and it tries again later."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from bridge.service.storage.leader import Lease
from bridge.service.storage.pgdialect import StoreOperationalError
from bridge.service.storage.standby import run_with_standby
from helpers.pgstore import fresh_schema
from helpers.waiting import until

SHUTTING_DOWN = "PostgreSQL: connection failed: FATAL:  the database system is shutting down"


def cluster_config(url: str, password: str | None) -> SimpleNamespace:
    return SimpleNamespace(store=SimpleNamespace(url=url, password=password),
                           appservice=SimpleNamespace(enabled=False), metrics=SimpleNamespace(enabled=False))


async def test_alone_it_leads_again_after_the_store_failed_to_open(postgres_server):
    config = cluster_config(fresh_schema(postgres_server), postgres_server.password)
    stop = asyncio.Event()
    terms: list[int | None] = []

    async def serve(_config, _term, lease: Lease) -> None:
        terms.append(lease.epoch)
        if len(terms) == 1:
            raise StoreOperationalError(SHUTTING_DOWN)
        stop.set()

    await asyncio.wait_for(run_with_standby(config, stop, serve), 30)
    assert len(terms) == 2 and terms[1] > terms[0]  # a new term, under a new epoch


async def test_with_another_instance_the_lease_goes_to_it_at_once(postgres_server):
    url = fresh_schema(postgres_server)
    config = cluster_config(url, postgres_server.password)
    stop = asyncio.Event()
    other = Lease(url, postgres_server.password)
    terms = 0

    async def serve(_config, _term, _lease: Lease) -> None:
        nonlocal terms
        terms += 1
        other.start()  # a second instance, standing by
        raise StoreOperationalError(SHUTTING_DOWN)

    running = asyncio.ensure_future(run_with_standby(config, stop, serve))
    try:
        # Well before the failed leader's lease would have run out by itself (4 s).
        await until(lambda: other.leading, timeout=3)
        assert not running.done() and terms == 1
    finally:
        stop.set()
        await asyncio.wait_for(running, 15)
        other.stop()


def test_a_bot_without_metrics_on_a_cluster_loads_no_http_server_to_stand_by():
    # Each start pays for what it imports (aiohttp's server is a sixtieth of
    # a second): an instance with no listener to stand by on has no use for it.
    import subprocess
    import sys

    code = ("import sys, bridge.service.app, bridge.service.storage.standby;"
            " print('aiohttp.web' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert found == "False"
