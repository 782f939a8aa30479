"""The appservice transaction endpoint with a stand-in pipeline, and the
pipeline's guard against one event that cannot be processed."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

import bridge.service.answering.pipeline as pipeline_module
from bridge.service.transport import appservice
from bridge.service.transport.appservice import TransactionServer, txn_key, user_namespace
from bridge.service.config import parse_config
from bridge.service.answering.pipeline import BatchResult, Pipeline
from bridge.service.storage.store import Store

TOKEN = "hs-secret"
ROOM = "!room:example.org"


def config(tmp_path: Path):
    raw = {
        "homeserver": {"url": "http://127.0.0.1:8008"},
        "bot": {"user_id": "@askbot:example.org"},
        "sets": {"root": "sets"},
        "rooms": {"default": ROOM},
        "store": {"path": "bridge.sqlite"},
        "appservice": {"enabled": True, "as_token": "as-secret", "hs_token": TOKEN, "listen": "127.0.0.1:0"},
    }
    return parse_config(raw, base_dir=tmp_path, environ={})


class StandIn:
    """Records what it is given; commits like the real pipeline; can be told to fail."""

    def __init__(self, store: Store):
        self.store = store
        self.batches: list[list[dict[str, Any]]] = []
        self.fail: Exception | None = None

    async def prepare(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return events

    def process(self, events: list[dict[str, Any]], *, commit=None, delivery=None) -> BatchResult:
        if self.fail:
            raise self.fail
        if delivery is not None and self.store.txn_seen(delivery):
            return BatchResult(repeated=True)
        self.batches.append(events)
        with self.store.transaction():
            if commit:
                commit()
        return BatchResult(accepted=len(events))


@pytest.fixture
async def served(tmp_path, store_backend):
    store = Store(tmp_path / "bridge.sqlite")
    stand_in = StandIn(store)
    server = TransactionServer(config(tmp_path), store, stand_in)  # type: ignore[arg-type]
    server.open([ROOM], notices=None)  # type: ignore[arg-type]
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    yield client, stand_in, server
    await client.close()
    store.close()


def event(n: int, room: str = ROOM) -> dict[str, Any]:
    return {"type": "m.room.message", "event_id": f"$e{n}", "room_id": room, "sender": "@p:example.org",
            "origin_server_ts": 1, "content": {"msgtype": "m.text", "body": str(n)}}


BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_transaction_is_processed_once(served):
    client, stand_in, _ = served
    body = {"events": [event(1), event(2, room="!elsewhere:example.org")]}
    for _ in range(2):
        response = await client.put("/_matrix/app/v1/transactions/7", json=body, headers=BEARER)
        assert (response.status, await response.json()) == (200, {})
    assert [[e["event_id"] for e in batch] for batch in stand_in.batches] == [["$e1"]]  # only the bridged room


async def test_the_legacy_path_and_query_token_work(served):
    client, stand_in, _ = served
    response = await client.put("/transactions/8", json={"events": [event(3)]}, params={"access_token": TOKEN})
    assert response.status == 200 and len(stand_in.batches) == 1


@pytest.mark.parametrize("headers,params", [({"Authorization": "Bearer nope"}, {}), ({}, {}),
                                            ({}, {"access_token": "nope"}),
                                            # Both given, one wrong: the spec asks both to match.
                                            (BEARER, {"access_token": "nope"}),
                                            # Bytes no UTF-8: a 500 and a traceback for anyone to cause.
                                            ({"Authorization": "Bearer \xff\xfe"}, {})])
async def test_a_wrong_or_missing_token_is_forbidden(served, headers, params):
    client, stand_in, _ = served
    for path in ("/_matrix/app/v1/transactions/9", "/transactions/9"):
        response = await client.put(path, json={"events": [event(4)]}, headers=headers, params=params)
        assert response.status == 403 and (await response.json())["errcode"] == "M_FORBIDDEN"
    response = await client.post("/_matrix/app/v1/ping", json={}, headers=headers, params=params)
    assert response.status == 403
    assert stand_in.batches == []


@pytest.mark.parametrize("txn_id", ["%C2%B2", "9" * 5000])
async def test_a_transaction_id_that_is_no_number_int_reads_is_taken(served, txn_id):
    # "²" is a digit to isdigit and no number to int, as are 4,300 digits and
    # more: the look for a skipped transaction failed it with a 500 on every try.
    client, stand_in, server = served

    class Looking:
        def heard(self) -> None:
            pass

    server.catchup = Looking()
    response = await client.put(f"/_matrix/app/v1/transactions/{txn_id}", json={"events": [event(6)]},
                                headers=BEARER)
    assert response.status == 200, await response.text()
    assert len(stand_in.batches) == 1


async def test_a_failure_is_a_500_and_the_resend_is_processed(served):
    client, stand_in, _ = served
    stand_in.fail = OSError(28, "No space left on device")
    response = await client.put("/_matrix/app/v1/transactions/10", json={"events": [event(5)]}, headers=BEARER)
    assert response.status == 500 and (await response.json())["errcode"] == "M_UNKNOWN"
    stand_in.fail = None
    response = await client.put("/_matrix/app/v1/transactions/10", json={"events": [event(5)]}, headers=BEARER)
    assert response.status == 200 and len(stand_in.batches) == 1


async def test_ping_health_and_queries(served):
    client, _, _ = served
    assert await (await client.post("/_matrix/app/v1/ping", json={}, headers=BEARER)).json() == {}
    assert await (await client.get("/health")).json() == {"live": True, "ready": True}
    for path in ("/_matrix/app/v1/users/@x:example.org", "/_matrix/app/v1/rooms/%23a:example.org"):
        response = await client.get(path, headers=BEARER)
        assert response.status == 404 and (await response.json())["errcode"] == "M_NOT_FOUND"
    assert (await client.get("/_matrix/app/v1/thirdparty/protocol/x", headers=BEARER)).status == 404


async def test_bad_bodies_are_refused(served):
    client, _, _ = served
    response = await client.put("/_matrix/app/v1/transactions/11", data=b"{", headers=BEARER)
    assert (await response.json())["errcode"] == "M_NOT_JSON"
    response = await client.put("/_matrix/app/v1/transactions/11", json={"events": {}}, headers=BEARER)
    assert (await response.json())["errcode"] == "M_BAD_JSON"


@pytest.mark.usefixtures("store_backend")
async def test_a_transaction_during_start_up_waits_then_gets_503(tmp_path, monkeypatch):
    monkeypatch.setattr(appservice, "READY_WAIT", 0.1)
    store = Store(tmp_path / "bridge.sqlite")
    server = TransactionServer(config(tmp_path), store, StandIn(store))  # type: ignore[arg-type]
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    try:
        assert await (await client.get("/health")).json() == {"live": True, "ready": False}
        response = await client.put("/_matrix/app/v1/transactions/1", json={"events": []}, headers=BEARER)
        assert response.status == 503
        assert not store.txn_seen(txn_key("1", []))
    finally:
        await client.close()
        store.close()


@pytest.mark.usefixtures("store_backend")
async def test_a_transaction_turned_away_during_start_up_still_gives_its_room_keys(tmp_path, monkeypatch):
    """A transaction that came while the bridge was starting got its 503
    before its to-device messages were taken; the homeserver sends its room
    events again, never those, so the room keys and device lists were lost."""
    monkeypatch.setattr(appservice, "READY_WAIT", 0.1)
    store = Store(tmp_path / "bridge.sqlite")
    server = TransactionServer(config(tmp_path), store, StandIn(store))  # type: ignore[arg-type]
    taken: list[str] = []

    async def take(body: dict[str, Any], txn_id: str) -> None:
        taken.append(txn_id)

    server.crypto = object()  # the encryption is up before the listener
    monkeypatch.setattr(server, "_take_extensions", take)
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    try:
        body = {"events": [event(1)], "de.sorunome.msc2409.to_device": [{"type": "m.room.encrypted"}]}
        response = await client.put("/_matrix/app/v1/transactions/1", json=body, headers=BEARER)
        assert response.status == 503 and taken == ["1"]
    finally:
        await client.close()
        store.close()


def test_the_key_tells_a_reset_homeservers_transactions_apart():
    assert txn_key("1", [event(1)]) == txn_key("1", [{**event(1), "unsigned": {"age": 5}}])
    assert txn_key("1", [event(1)]) != txn_key("1", [event(2)])


def test_the_namespace_holds_the_bridge_user_and_its_prefix(tmp_path):
    import re

    regexes = [re.compile(r) for r in user_namespace(config(tmp_path))]
    assert any(r.fullmatch("@askbot:example.org") for r in regexes)
    assert any(r.fullmatch("@askwright_alice:example.org") for r in regexes)
    assert not any(r.fullmatch("@askbotx:example.org") or r.fullmatch("@askbot:exampleXorg") for r in regexes)


# -- one poisoned event ------------------------------------------------------------

class Quiet:
    user_id = "@askbot:example.org"

    async def send(self, *args: Any) -> str:
        return "$sent"

    async def joined_members(self, room_id: str) -> set[str]:
        return set()


@pytest.mark.usefixtures("store_backend")
def test_an_event_that_raises_is_refused_and_the_rest_goes_on(tmp_path, monkeypatch):
    store = Store(tmp_path / "bridge.sqlite")
    pipeline = Pipeline(store=store, transport=Quiet(), answerers=None, own_users=lambda u: u == Quiet.user_id)
    real = pipeline_module.normalize
    seen: list[str] = []

    def flaky(ev, lookup):
        seen.append(ev["event_id"])
        if ev["event_id"] == "$e1":
            raise KeyError("a shape nobody expected")
        return real(ev, lookup)

    monkeypatch.setattr(pipeline_module, "normalize", flaky)
    marker: list[bool] = []
    result = pipeline.process([event(1), event(2)], commit=lambda: marker.append(True))
    # The batch is handled again with its events apart (its first pass shared
    # one part of the transaction), where $e1 is set aside alone.
    assert seen == ["$e1", "$e1", "$e2"] and marker == [True]
    assert result.refused == 1
    assert store.is_processed("$e1")  # $e2 is no answer at all: nothing to remember about it
    rows = store.db.execute("SELECT event_id, outcome, layer, reason FROM answer_log").fetchall()
    assert rows == [("$e1", "refused", "schema", "internal_error")]
    # Redelivered, nothing of it is judged again.  (On PostgreSQL a batch
    # takes its events as new and is handled again once the server says one
    # was processed: what that first pass did is not kept, ``guesses``.)
    again = pipeline.process([event(1)])
    assert again.skipped == 1 and again.refused == 0
    assert store.db.execute("SELECT event_id, outcome, layer, reason FROM answer_log").fetchall() == rows
    store.close()


@pytest.mark.usefixtures("store_backend")
def test_a_store_error_fails_the_whole_batch(tmp_path, monkeypatch):
    store = Store(tmp_path / "bridge.sqlite")
    pipeline = Pipeline(store=store, transport=Quiet(), answerers=None, own_users=lambda u: False)

    def busy(ev, lookup):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(pipeline_module, "normalize", busy)
    marker: list[bool] = []
    with pytest.raises(sqlite3.OperationalError):
        pipeline.process([event(1)], commit=lambda: marker.append(True))
    assert marker == [] and not store.is_processed("$e1")
    store.close()


async def test_notices_are_woken_after_a_transaction(served):
    client, _, server = served

    class Bell:
        rung = 0

        def homeserver_answered(self) -> None:  # (the homeserver is there: it pushed the transaction)
            Bell.rung += 1

    server.notices = Bell()
    await client.put("/_matrix/app/v1/transactions/12", json={"events": [event(6)]}, headers=BEARER)
    assert Bell.rung == 1
    await asyncio.sleep(0)


async def test_another_method_on_a_known_endpoint_is_405_unrecognized(served):
    # The catch-all answered 404: the spec's "unknown routes" asks 405 M_UNRECOGNIZED here.
    client, stand_in, _ = served
    for method, path in (("GET", "/_matrix/app/v1/transactions/4"), ("POST", "/_matrix/app/v1/transactions/4"),
                         ("DELETE", "/transactions/4"), ("GET", "/_matrix/app/v1/ping"),
                         ("POST", "/_matrix/app/v1/users/@a:example.org")):
        response = await client.request(method, path, headers=BEARER)
        assert response.status == 405, (method, path, response.status)
        assert (await response.json())["errcode"] == "M_UNRECOGNIZED"
    assert (await client.get("/_matrix/app/v1/nothing", headers=BEARER)).status == 404
    assert stand_in.batches == []


async def test_a_listen_address_in_use_is_a_config_refused_naming_its_key(tmp_path):
    # A traceback and exit 1 (a service manager restarts that in a loop), after the bridge had logged in.
    import socket

    from bridge.service.config import ConfigError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = config(tmp_path)
        busy.appservice.listen = f"127.0.0.1:{taken.getsockname()[1]}"
        store = Store(tmp_path / "bridge.sqlite")
        server = TransactionServer(busy, store, StandIn(store))  # type: ignore[arg-type]
        try:
            with pytest.raises(ConfigError, match="appservice.listen: 127.0.0.1:[0-9]+ can't be listened on"):
                await server.start()
        finally:
            await server.close()
            store.close()


async def test_encryption_parts_that_fail_hold_up_no_room_events(served, monkeypatch, caplog):
    """nio failed on a transaction's to-device messages: the transaction was
    refused with 500, "it will come again"; Synapse sends a transaction's room
    events again, never its to-device messages, so the keys were lost all the
    same and the room events held up."""
    import logging

    client, stand_in, server = served

    class Crypto:
        client = None

        def note_events(self, events: list[dict[str, Any]]) -> None:
            pass

        async def screen(self, events: list[dict[str, Any]], own: Any) -> tuple[list[dict[str, Any]], list[str]]:
            return events, []

    async def failing(client: Any, body: dict[str, Any], txn_id: str) -> None:
        raise RuntimeError("nio's key store is locked")

    from bridge.service.encryption import ascrypto

    server.crypto = Crypto()
    stand_in.own_users = frozenset()
    monkeypatch.setattr(ascrypto, "take_extensions", failing)
    caplog.set_level(logging.WARNING)
    body = {"events": [event(9)], "de.sorunome.msc2409.to_device": [{"type": "m.room.encrypted"}]}
    response = await client.put("/_matrix/app/v1/transactions/12", json=body, headers=BEARER)
    assert response.status == 200, await response.text()
    assert [[e["event_id"] for e in batch] for batch in stand_in.batches] == [["$e9"]]
    assert any("does not send them again" in r.getMessage() for r in caplog.records)


# -- the homeserver's pooled connections -------------------------------------------

async def _idle_close_after(port: int) -> float:
    """Seconds the listener keeps a connection idle after answering on it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: bridge\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        answered = time.monotonic()
        while await asyncio.wait_for(reader.read(4096), 30):  # the rest of the answer, then the close
            answered = time.monotonic()
        return time.monotonic() - answered
    finally:
        writer.close()


@pytest.mark.sqlite_only
async def test_synapses_next_transaction_never_meets_a_connection_the_bridge_is_closing(tmp_path, monkeypatch):
    """The bridge closed an idle connection after 75 s, Synapse's pool keeps
    one 2 min: a transaction Synapse put on it as the close came (its
    reactor busy a moment) failed, Synapse does not send a PUT again on a
    new connection, and its recoverer resent it seconds later.  Now the
    homeserver's pool always closes first.  Twisted's pool as Synapse sets it
    up, every idle figure a hundredth of production's; the push lands just
    after the moment the bridge closes an idle connection."""
    from bridge.devserver import free_port
    from bridge.service.operators import health

    scale = 0.01
    synapse_pool = 120 * scale  # synapse/http/client.py: pool.cachedConnectionTimeout = 2 * 60
    monkeypatch.setattr(health, "IDLE_SECONDS", health.IDLE_SECONDS * scale)  # every listener's, and was this one's
    # The figure the transaction listener's own limit is worked out from
    # (raising=False: the bridge before it had none, and is tried the same way).
    monkeypatch.setattr(appservice, "HOMESERVER_KEEPS_IDLE", synapse_pool, raising=False)
    listening = config(tmp_path)
    port = free_port()
    listening.appservice.listen = f"127.0.0.1:{port}"
    store = Store(tmp_path / "bridge.sqlite")
    server = TransactionServer(listening, store, StandIn(store))  # type: ignore[arg-type]
    await server.start()
    server.open([ROOM], notices=None)  # type: ignore[arg-type]
    try:
        closes_after = await _idle_close_after(port)
        busy_from, busy_for = max(closes_after - 0.2, 0.0), 0.4  # the close comes while Synapse is busy
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "helpers.synapse_push", f"http://127.0.0.1:{port}", TOKEN, str(synapse_pool),
            str(busy_from), str(busy_for), cwd=Path(__file__).resolve().parents[1],
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode()
        assert json.loads(out) == ["200", "200"]  # the second push, not RequestTransmissionFailed
    finally:
        await server.close()
        store.close()
