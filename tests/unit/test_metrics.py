"""Metrics: the counters move, the exposition shows them, /health says ready only once ready."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import urllib.error
import urllib.request

from aiohttp.test_utils import TestClient, TestServer

from bridge.devserver import free_port
from bridge.service.config import parse_config
from bridge.service.operators.health import health_app, start_http
from bridge.service.operators.metrics import Metrics
from bridge.service.operators.operators import Operators
from bridge.service.storage.store import LogEntry, Store


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels or None)


def entry(outcome: str, layer: str | None = None, reason: str | None = None) -> LogEntry:
    return LogEntry("$a", "!r", "@p:hs", "answer_event", outcome, layer=layer, reason=reason)


def test_outcomes_count_accepted_and_refused_by_layer_and_reason():
    metrics = Metrics()
    metrics.observe_outcome(entry("accepted"))
    metrics.observe_outcome(entry("accepted"))
    metrics.observe_outcome(entry("refused", "recorded", "question_closed"))
    metrics.observe_outcome(entry("refused", "schema", "not_json"))
    metrics.observe_outcome(entry("refused", "schema", "not_json"))
    metrics.observe_outcome(entry("annotated"))  # a note is not an answer: counted nowhere here
    assert sample(metrics, "askwright_bridge_answers_accepted_total") == 2
    assert sample(metrics, "askwright_bridge_answers_refused_total", layer="recorded", reason="question_closed") == 1
    assert sample(metrics, "askwright_bridge_answers_refused_total", layer="schema", reason="not_json") == 2


def test_a_refusal_without_layer_or_reason_is_labelled_unknown():
    metrics = Metrics()
    metrics.observe_outcome(entry("refused"))
    assert sample(metrics, "askwright_bridge_answers_refused_total", layer="unknown", reason="unknown") == 1


def test_a_batch_counts_its_events_and_sets_the_lag_from_the_newest():
    metrics = Metrics(clock=lambda: 1_000.0)
    metrics.observe_batch([{"origin_server_ts": 990_000}, {"origin_server_ts": 997_500}, {"type": "x"}, "junk"])
    assert sample(metrics, "askwright_bridge_events_processed_total") == 4
    assert sample(metrics, "askwright_bridge_sync_lag_seconds") == 2.5
    metrics.observe_batch([])  # nothing newer handled: the lag stays
    assert sample(metrics, "askwright_bridge_sync_lag_seconds") == 2.5
    metrics.observe_batch([{"origin_server_ts": 1_000_500}])  # clocks differ a little: never negative
    assert sample(metrics, "askwright_bridge_sync_lag_seconds") == 0


def test_posts_writes_and_errors_are_recorded():
    metrics = Metrics()
    metrics.observe_posted()
    metrics.observe_posted(object())
    metrics.observe_write(0.004)
    metrics.observe_write(0.2)
    metrics.observe_error("sync")
    assert sample(metrics, "askwright_bridge_questions_posted_total") == 2
    assert sample(metrics, "askwright_bridge_answers_write_seconds_count") == 2
    assert sample(metrics, "askwright_bridge_answers_write_seconds_bucket", le="0.005") == 1
    assert sample(metrics, "askwright_bridge_errors_total", where="sync") == 1


def test_warnings_logged_anywhere_in_the_bridge_count_as_errors_by_module():
    metrics = Metrics()
    handler = metrics.error_counter()
    logger = logging.getLogger("bridge")
    logger.addHandler(handler)
    try:
        logging.getLogger("bridge.service.transport.bot").warning("sync batch not handled")
        logging.getLogger("bridge.service.posting.poster").error("set skipped")
        logging.getLogger("bridge.service.posting.poster").info("question posted")  # not an error
    finally:
        logger.removeHandler(handler)
    assert sample(metrics, "askwright_bridge_errors_total", where="bot") == 1
    assert sample(metrics, "askwright_bridge_errors_total", where="poster") == 1


def test_the_exposition_is_prometheus_text_with_the_bridge_metrics_only():
    metrics = Metrics()
    metrics.observe_posted()
    text = metrics.exposition().decode()
    assert "# TYPE askwright_bridge_questions_posted_total counter" in text
    assert "askwright_bridge_questions_posted_total 1.0" in text
    assert "# TYPE askwright_bridge_answers_write_seconds histogram" in text
    assert "askwright_bridge_ready 0.0" in text
    # A private registry: no process or platform collectors of the global one.
    assert "process_" not in text and "python_info" not in text


def test_two_bridges_in_one_process_do_not_share_counters():
    first, second = Metrics(), Metrics()
    first.observe_posted()
    assert sample(second, "askwright_bridge_questions_posted_total") == 0


async def test_health_is_503_until_ready_then_200_and_metrics_are_served():
    metrics = Metrics()
    client = TestClient(TestServer(health_app(metrics)))
    await client.start_server()
    try:
        response = await client.get("/health")
        assert response.status == 503
        assert await response.json() == {"live": True, "ready": False}
        metrics.mark_ready()
        response = await client.get("/health")
        assert response.status == 200
        assert await response.json() == {"live": True, "ready": True}
        metrics.observe_outcome(entry("accepted"))
        response = await client.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        body = await response.text()
        assert "askwright_bridge_answers_accepted_total 1.0" in body
        assert "askwright_bridge_ready 1.0" in body
        metrics.mark_not_ready()
        assert (await client.get("/health")).status == 503
    finally:
        await client.close()


async def test_health_answers_from_the_held_counts_without_waiting_for_the_store(tmp_path, monkeypatch):
    store = Store(tmp_path / "bridge.sqlite")
    config = parse_config({"homeserver": {"url": "http://127.0.0.1:9"},
                           "bot": {"user_id": "@a:hs", "access_token": "t"}, "sets": {"root": str(tmp_path / "sets")},
                           "rooms": {"default": "!r"}, "store": {"path": str(tmp_path / "bridge.sqlite")}},
                          base_dir=tmp_path, environ={})
    ops = Operators(config, store)
    ops.metrics.mark_ready()
    read: list[bool] = []

    def busy_store() -> list:  # a database far away or busy: its answer does not come back for seconds
        read.append(True)
        threading.Event().wait(5)
        return []

    monkeypatch.setattr(store, "held_sets", busy_store)
    client = TestClient(TestServer(health_app(ops.metrics)))
    await client.start_server()
    try:
        response = await client.get("/health")
        body = await response.json()
        assert body["held"] == {"sets_held": 0, "events_set_aside": 0, "notices_dropped": 0, "events_waiting": 0,
                                "sets_not_posted": 0, "webhooks_pending": 0}
        assert read == []  # read by the supervised refresh, on the store's thread, never by /health
    finally:
        await client.close()
        store.close()



async def test_start_http_serves_on_the_configured_address_and_stops():
    metrics = Metrics()
    port = free_port()
    runner = await start_http(f"127.0.0.1:{port}", metrics)

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    try:
        status, _body = await asyncio.to_thread(get, "/health")
        assert status == 503
        metrics.mark_ready()
        metrics.observe_posted()
        assert (await asyncio.to_thread(get, "/health"))[0] == 200
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and "askwright_bridge_questions_posted_total 1.0" in body
    finally:
        await runner.cleanup()
    with socket.socket() as sock:  # nobody listens any more
        assert sock.connect_ex(("127.0.0.1", port)) != 0


async def test_a_connection_that_sends_nothing_is_closed_and_the_descriptor_limit_is_raised(monkeypatch):
    # aiohttp keeps a silent connection an hour: a thousand of them held every
    # descriptor of a service's default 1024, and the first answer after them
    # was refused. Each listener closes them after IDLE_SECONDS (a minute and
    # a bit; shortened here).
    import subprocess
    import sys

    from bridge.service.operators import health

    monkeypatch.setattr(health, "IDLE_SECONDS", 0.5)
    port = free_port()
    runner = await start_http(f"127.0.0.1:{port}", Metrics())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed by the bridge, nothing said
        writer.close()
    finally:
        await runner.cleanup()
    # The soft limit (a service manager's 1024) goes up to the hard one at start.
    code = ("import resource; from bridge.service.descriptors import raise_to_hard_limit;"
            " raise_to_hard_limit(); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run(["prlimit", "--nofile=1024:4096", sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "4096"


def test_the_matrix_client_librarys_warnings_count_and_the_homeservers_silence_shows():
    """nio retries a homeserver that does not answer without end, logging only
    its own warnings: they count (where="nio"), and bot mode's silence since
    the last sync is a gauge and a /health field."""
    now = [1000.0]
    metrics = Metrics(clock=lambda: now[0])
    assert sample(metrics, "askwright_bridge_homeserver_silent_seconds") != 0  # NaN: no sync yet (appservice mode)
    handler = metrics.error_counter(where="nio")
    logger = logging.getLogger("nio")
    logger.addHandler(handler)
    try:
        logging.getLogger("nio.client.async_client").warning("Timed out, sleeping for 5s")
    finally:
        logger.removeHandler(handler)
    assert sample(metrics, "askwright_bridge_errors_total", where="nio") == 1
    metrics.heard()
    now[0] += 42.5
    assert sample(metrics, "askwright_bridge_homeserver_silent_seconds") == 42.5
    assert metrics.silent_seconds == 42.5


def test_encrypted_answers_waiting_for_their_keys_are_counted_in_what_is_held(tmp_path):
    """An answer from a person whose homeserver is frozen (its devices
    unread) or whose key has not come is kept; /health showed nothing of it."""
    from bridge.service.storage.heldback import counts, format_held, held_back

    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.keep_undecrypted({"type": "m.room.encrypted", "event_id": "$e", "room_id": "!r:hs",
                                "sender": "@remote:elsewhere", "origin_server_ts": 1, "content": {}}, 0)
    held = held_back(store)
    assert counts(held)["events_waiting"] == 1
    assert "1 encrypted event(s) waiting for their keys or their senders' devices" in format_held(held)
    store.close()


def test_a_database_away_is_not_read_as_nothing_held_back():
    """PostgreSQL restarting: its errors read as SQLite's OperationalError,
    which was taken for a store not migrated yet, so /health's held-back
    counts fell to 0 and status said nothing was held back."""
    from types import SimpleNamespace

    import pytest

    from bridge.service.storage.heldback import held_back, nothing_held
    from bridge.service.storage.pgdialect import StoreOperationalError

    def failing(message: str) -> SimpleNamespace:
        def execute(*_args):
            raise StoreOperationalError(message)
        return SimpleNamespace(db=SimpleNamespace(execute=execute))

    with pytest.raises(StoreOperationalError):
        held_back(failing("PostgreSQL: consuming input failed: server closed the connection unexpectedly"))
    assert held_back(failing('PostgreSQL: relation "webhook_outbox" does not exist')) == nothing_held()
    assert held_back(failing("no such table: webhook_outbox")) == nothing_held()
