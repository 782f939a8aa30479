"""An instance of a cluster outlives a failed term as leader: its store
failing to open while PostgreSQL restarts (seen in the failover storm: the
leader's process exited) hands the lease on and it tries again later."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from bridge.protocol.recorded import RecordedQuestion
from bridge.service.auditing.keys import LogKeyError
from bridge.service.config import ConfigError
from bridge.service.storage.leader import Lease
from bridge.service.storage.pgdialect import StoreOperationalError
from bridge.service.storage.standby import run_with_standby
from bridge.service.storage.store import LogEntry, Store
from helpers.agents import free_port
from helpers.pgstore import fresh_schema
from helpers.waiting import until

SHUTTING_DOWN = "PostgreSQL: connection failed: FATAL:  the database system is shutting down"


def cluster_config(url: str, password: str | None, sets_root: Path = Path("/sets-not-here")) -> SimpleNamespace:
    return SimpleNamespace(store=SimpleNamespace(url=url, password=password, path="/store-not-here/bridge.db"),
                           appservice=SimpleNamespace(enabled=False), metrics=SimpleNamespace(enabled=False),
                           audit=SimpleNamespace(enabled=False), sets=SimpleNamespace(root=sets_root), agents=None)


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


async def test_handing_the_lease_on_after_a_failed_term_holds_up_nothing_else(postgres_server, monkeypatch):
    """The lease was handed on by connecting to PostgreSQL on the event loop:
    with the database away (a 3 s connect timeout) /health and everything
    else on the loop waited for it."""
    import time

    config = cluster_config(fresh_schema(postgres_server), postgres_server.password)
    stop = asyncio.Event()
    real = Lease.release
    during: list[float] = []

    def slow_release(self: Lease, hold_off: float) -> None:
        began = time.monotonic()
        time.sleep(1.0)  # the connect to an unreachable database, timing out
        real(self, hold_off)
        during.append(began)

    monkeypatch.setattr(Lease, "release", slow_release)
    ticks: list[float] = []

    async def ticking() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.05)

    terms = 0

    async def serve(_config, _term, _lease: Lease) -> None:
        nonlocal terms
        terms += 1
        if terms == 1:
            raise StoreOperationalError(SHUTTING_DOWN)
        stop.set()

    ticker = asyncio.ensure_future(ticking())
    await asyncio.wait_for(run_with_standby(config, stop, serve), 30)
    await ticker
    (began,) = during
    assert len([t for t in ticks if began < t < began + 1.0]) >= 10  # the loop ran on meanwhile


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


async def test_what_will_not_fix_itself_ends_the_instance_instead_of_going_round(postgres_server):
    # A key file missing for a log with leaves, a config or credentials
    # refused: on SQLite the bridge exits (2 or 1); on a cluster it used to
    # hand the lease on and try again every 1 to 30 s for ever, reporting a
    # standby nobody would look at.
    config = cluster_config(fresh_schema(postgres_server), postgres_server.password)
    terms = 0

    async def serve(_config, _term, _lease: Lease) -> None:
        nonlocal terms
        terms += 1
        raise LogKeyError("the answer log has 3 leaves but its key file is missing")

    with pytest.raises(LogKeyError):
        await asyncio.wait_for(run_with_standby(config, asyncio.Event(), serve, fatal=(LogKeyError,)), 15)
    assert terms == 1


async def test_a_standby_without_the_logs_key_refuses_to_start_not_at_the_failover(postgres_server, tmp_path):
    url = fresh_schema(postgres_server)
    store = Store(tmp_path / "unused.db", url=url, password=postgres_server.password)
    store.log(LogEntry(event_id="$a", room_id="!r:hs", sender="@a:hs", via="answer_event", outcome="refused",
                       layer="schema", reason="x", message="x", ts=1))
    store.close()
    config = cluster_config(url, postgres_server.password)
    config.store.path = str(tmp_path / "bridge.db")
    config.audit = SimpleNamespace(enabled=True, key_file=None)

    async def serve(*_args) -> None:
        raise AssertionError("never leads")

    with pytest.raises(LogKeyError, match="1 leaves but its key file"):
        await asyncio.wait_for(run_with_standby(config, asyncio.Event(), serve, fatal=(LogKeyError,)), 15)


@pytest.mark.parametrize("given", ["another key", "no key file"])
async def test_a_standby_given_another_keys_file_refuses_to_start(postgres_server, tmp_path, given):
    """Given another key than the one that signed the log, a standby would
    take over and sign on with it: every checkpoint the rooms hold would
    then read as forged.  Given none while the log had no leaf yet (the
    leader made its key at its first start), it stood by, then exited at
    the failover: no instance led."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from bridge.service.auditing.keys import LogKey, write_key

    url = fresh_schema(postgres_server)
    store = Store(tmp_path / "unused.db", url=url, password=postgres_server.password)
    signing = LogKey("example.org/askwright-bridge/bridge", Ed25519PrivateKey.generate())
    with store.transaction():
        store.set_meta("audit_key", signing.verifier_key)
    store.close()
    config = cluster_config(url, postgres_server.password)
    config.store.path = str(tmp_path / "bridge.db")
    config.audit = SimpleNamespace(enabled=True, key_file=None)
    if given == "another key":
        write_key(tmp_path / "bridge.db.log-key", LogKey(signing.origin, Ed25519PrivateKey.generate()))

    async def serve(*_args) -> None:
        raise AssertionError("never leads")

    with pytest.raises(LogKeyError, match="holds another key" if given == "another key" else "give it the same file"):
        await asyncio.wait_for(run_with_standby(config, asyncio.Event(), serve, fatal=(LogKeyError,)), 15)


async def test_a_standby_that_sees_the_sets_at_another_path_refuses_to_start(postgres_server, tmp_path):
    """The leader posted from /…/a/team/alpha; this machine has the same share at
    /…/b.  Taking over, it would find none of the store's sets and every set
    folder new: every question closed and posted again.  It says so at its
    start instead; where the sets are at the same path, it stands by."""
    url = fresh_schema(postgres_server)
    store = Store(tmp_path / "unused.db", url=url, password=postgres_server.password)
    # Sets nested as the scan finds them anywhere below the root, and one removed from the share meanwhile.
    with store.transaction():
        for n, folder in enumerate(("team/alpha", "gone")):
            store.record_posted(RecordedQuestion(event_id=f"$q{n}", room_id="!r:hs", set_id=f"s{n}",
                                                 content={"elicitation_id": f"elc_{n}", "set": f"s{n}",
                                                          "question": {"id": "q0", "rev": 1, "title": "T"}}),
                                set_dir=str(tmp_path / "a" / folder), posted_at=1)
    store.close()
    (tmp_path / "b" / "team" / "alpha").mkdir(parents=True)

    async def serve(*_args) -> None:
        raise AssertionError("never leads")

    elsewhere = cluster_config(url, postgres_server.password, tmp_path / "b")
    with pytest.raises(ConfigError, match=f"under {tmp_path / 'a'}, which this machine does not have.*same path"):
        await asyncio.wait_for(run_with_standby(elsewhere, asyncio.Event(), serve), 15)

    (tmp_path / "a" / "team" / "alpha").mkdir(parents=True)  # the share where the store knows it
    stop = asyncio.Event()

    async def leads(*_args) -> None:
        stop.set()

    await asyncio.wait_for(run_with_standby(cluster_config(url, postgres_server.password, tmp_path / "a"), stop,
                                            leads), 15)
    assert stop.is_set()


async def test_a_standby_serving_agents_without_metrics_answers_health_where_its_leader_would(postgres_server):
    # The leader serves /health beside the agents' API even with metrics off;
    # a standby that served nothing there read as dead to the probe that
    # restarts what does not answer.
    import aiohttp

    url = fresh_schema(postgres_server)
    leader = Lease(url, postgres_server.password)
    leader.start()
    await until(lambda: leader.leading, timeout=10)
    port = free_port()
    config = cluster_config(url, postgres_server.password)
    config.agents = SimpleNamespace()
    config.metrics = SimpleNamespace(enabled=False, listen_host_port=("127.0.0.1", port))
    stop = asyncio.Event()

    async def serve(*_args) -> None:
        raise AssertionError("the standby led while the other instance held the lease")

    standing_by = asyncio.ensure_future(run_with_standby(config, stop, serve))
    try:
        async with aiohttp.ClientSession() as http:
            async def health() -> tuple[int, dict] | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as response:
                        return response.status, await response.json()
                except aiohttp.ClientConnectionError:
                    return None

            deadline = asyncio.get_running_loop().time() + 10
            while (seen := await health()) is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
        assert seen is not None, "nothing answered /health where the leader serves it"
        status, body = seen
        assert status == 503 and body["role"] == "standby"
    finally:
        stop.set()
        await asyncio.wait_for(standing_by, 15)
        leader.stop()


def test_a_bot_without_metrics_on_a_cluster_loads_no_http_server_to_stand_by():
    # Each start pays for what it imports (aiohttp's server is a sixtieth of
    # a second): an instance with no listener to stand by on has no use for it.
    import subprocess
    import sys

    code = ("import sys, bridge.service.app, bridge.service.storage.standby;"
            " print('aiohttp.web' in sys.modules)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert found == "False"


def test_move_sets_against_a_database_the_bridge_never_used_makes_no_tables_there(postgres_server, tmp_path,
                                                                                  capsys):
    """A wrong store.url: it made the bridge's 22 tables in that database,
    then said the store knew no set under the old root."""
    import psycopg
    import yaml

    from bridge.cli import main
    from helpers.config import GOOD

    url = fresh_schema(postgres_server)
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in GOOD.items()}
    data["store"] = {"path": str(tmp_path / "bridge.db"), "url": url, "password": postgres_server.password}
    data["sets"] = {"root": str(tmp_path / "sets")}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["store", "move-sets", "-c", str(config), "--from", str(tmp_path / "old")]) == 2
    assert "there is no store at" in capsys.readouterr().err
    schema = url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(postgres_server.url(with_password=True)) as conn:
        tables = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema=%s",
                              (schema,)).fetchone()[0]
    assert tables == 0


async def test_a_term_failing_on_the_stores_connection_is_said_on_the_standbys_health(postgres_server):
    # The database out of connection slots for the store while the lease's
    # own connection held: the instances took turns leading, each failing to
    # open its store, and /health said only {"role": "standby"}.  A role's
    # connection limit refuses the store's new connection the same way.
    import aiohttp
    import psycopg

    url = fresh_schema(postgres_server)
    schema = url.rsplit("search_path%3D", 1)[1]
    role = f"limited_{free_port()}"
    admin = psycopg.connect(postgres_server.url(with_password=True), autocommit=True)
    admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")
    admin.execute(f"GRANT ALL ON SCHEMA {schema} TO {role}")
    limited = url.replace("://postgres@", f"://{role}@", 1)
    port = free_port()
    config = cluster_config(limited, "pw")
    config.metrics = SimpleNamespace(enabled=True, listen_host_port=("127.0.0.1", port))
    stop = asyncio.Event()
    failed = 0

    async def serve(config, _term, _lease: Lease) -> None:
        nonlocal failed
        try:
            Store(config.store.path, url=config.store.url, password=config.store.password)  # its first step
        except Exception:
            failed += 1
            raise
        stop.set()

    running = asyncio.ensure_future(run_with_standby(config, stop, serve))
    try:
        await until(lambda: failed >= 1, timeout=20)
        async with aiohttp.ClientSession() as http:
            async def told() -> dict | None:
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as response:
                        body = await response.json()
                        return body if "store_unreachable" in body else None
                except aiohttp.ClientConnectionError:
                    return None

            seen = await until(told, timeout=10)
        assert seen["role"] == "standby" and "connection" in seen["store_unreachable"]["error"], seen
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()



def test_a_failed_term_is_said_while_the_failures_go_on_not_once_another_instance_leads(monkeypatch):
    from bridge.service.storage import standby

    now = [100.0]
    monkeypatch.setattr(standby, "elapsed", lambda: now[0])
    terms = standby.FailedTerms()
    terms.failed(RuntimeError("the homeserver refused the login"))  # not the store's: said by the log only
    assert terms.trouble() is None
    terms.failed(StoreOperationalError("PostgreSQL: connection failed: FATAL: too many connections for role"))
    now[0] += 20
    terms.failed(StoreOperationalError("PostgreSQL: connection failed: FATAL: too many connections for role"))
    assert terms.trouble() == (20.0, "the store could not be used while leading: PostgreSQL: connection failed: "
                                     "FATAL: too many connections for role")
    now[0] += 2 * standby.LAST_BACKOFF + 1  # no term tried since: another instance leads
    assert terms.trouble() is None
