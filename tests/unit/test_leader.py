"""Leader and standby on a real PostgreSQL server: one lease, one leader,
and a leader that lost it writes nothing to the store."""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from bridge.service.storage.leader import _TABLES as LEASE_TABLES
from bridge.service.storage.leader import TTL_SECONDS, Lease, instances
from bridge.service.storage.leader import _clock as leader_clock
from bridge.service.storage.dialect import LeaseLost
from bridge.service.storage.store import Store
from helpers.netcut import Cable
from helpers.pgstore import fresh_schema


def wait_for(predicate, timeout: float = 15.0) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout, "not within the time"
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.fixture
def shared(postgres_server):
    url = fresh_schema(postgres_server)
    leases: list[Lease] = []

    def lease(url: str = url, **kw) -> Lease:
        made = Lease(url, postgres_server.password, **kw)
        made.start()
        leases.append(made)
        return made

    yield url, lease
    for made in leases:
        made.stop()


def freeze(lease: Lease) -> None:
    """The holder stops renewing without a word, as if its process were paused."""
    lease._halt.set()
    lease._thread.join()


def test_exactly_one_of_three_leads_and_status_lists_them(shared, postgres_server):
    url, lease = shared
    three = [lease(ttl=2) for _ in range(3)]
    wait_for(lambda: sum(x.leading for x in three) == 1)
    time.sleep(1.5)
    assert sum(x.leading for x in three) == 1
    wait_for(lambda: len(instances(url, postgres_server.password)) == 3)
    roles = [row["role"] for row in instances(url, postgres_server.password)]
    assert roles == ["leader", "standby", "standby"]


def test_a_standby_takes_over_a_silent_leader_with_a_higher_epoch(shared, postgres_server):
    url, lease = shared
    first = lease(ttl=2, name="a-first")  # (named so the stale one sorts first by name: the leader still leads the list)
    wait_for(lambda: first.leading)
    second = lease(ttl=2, name="b-second")
    time.sleep(1)
    assert not second.leading
    freeze(first)
    wait_for(lambda: second.leading, timeout=2 + 3)
    assert second.epoch == first.epoch + 1
    with pytest.raises(LeaseLost):
        first.check()  # its own clock ran out before the database let the standby in
    # Still heard from (its last word: it led), but only the lease's holder leads.
    rows = [(row["id"], row["role"]) for row in instances(url, postgres_server.password)]
    assert rows == [(second.name, "leader"), (first.name, "stale")]


def test_a_clean_stop_hands_the_lease_on_at_once(shared):
    _url, lease = shared
    first = lease(ttl=30)
    wait_for(lambda: first.leading)
    second = lease(ttl=30)
    first.stop()
    assert wait_for(lambda: second.leading, timeout=5) < 5


def test_a_leader_that_lost_the_lease_commits_nothing(shared, postgres_server):
    url, lease = shared
    old = lease(ttl=2)
    wait_for(lambda: old.leading)
    store = Store("unused", url=url, password=postgres_server.password)
    old.guard_store(store)
    with store.transaction():
        store.mark_processed("$before", "accepted")
    freeze(old)
    new = lease(ttl=2)
    wait_for(lambda: new.leading)
    old.role, old.valid_until = "leader", leader_clock() + 60  # resumed, and its clock lies
    with pytest.raises(sqlite3.OperationalError):
        with store.transaction():
            store.mark_processed("$after", "accepted")
    assert store.is_processed("$before") and not store.is_processed("$after")
    assert old.role == "standby"


class _PausedAfterLock:
    """A standby's lease connection that stops, as a paused process would,
    right after its ``SELECT ... FOR UPDATE`` locked the lease row."""

    def __init__(self, conn, seconds: float, paused: threading.Event):
        self._conn, self._seconds, self._paused = conn, seconds, paused

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, sql, *args, **kwargs):
        result = self._conn.execute(sql, *args, **kwargs)
        if "FOR UPDATE" in sql and not self._paused.is_set():
            self._paused.set()
            time.sleep(self._seconds)
        return result


def lapse(url: str, password: str, until) -> None:
    """The lease looks lapsed (its expiry moved back, as when the leader's
    renewal comes late) until ``until()``: a standby's look finds it so and
    locks the row to take it over; the leader's next renewal restores it."""
    with psycopg.connect(url, password=password, autocommit=True) as db:
        began = time.monotonic()
        while not until():
            assert time.monotonic() - began < 15, "the standby never locked the lease row"
            db.execute("UPDATE askwright_lease SET expires = clock_timestamp() - interval '1 second'"
                       " WHERE name = 'leader'")
            time.sleep(0.05)


def test_a_standby_paused_holding_the_lease_row_stalls_nobody(shared, postgres_server):
    # The standby locks the row only to take over a lease that lapsed: here
    # one whose renewal came late, the leader still there to renew it.
    url, lease = shared
    leader = lease()
    wait_for(lambda: leader.leading)
    store = Store("unused", url=url, password=postgres_server.password)
    leader.guard_store(store)
    paused = threading.Event()
    standby = Lease(url, postgres_server.password)
    take = standby._try_take
    standby._try_take = lambda conn: take(_PausedAfterLock(conn, TTL_SECONDS + 6, paused))
    standby.start()
    try:
        lapse(url, postgres_server.password, paused.is_set)
        began = time.monotonic()
        # The server ends the paused session and frees the row: the leader's
        # renewals and its fenced transactions go on.
        with store.transaction():
            store.mark_processed("$while-paused", "accepted")
        assert time.monotonic() - began < TTL_SECONDS
        while time.monotonic() - began < TTL_SECONDS + 5:
            assert leader.leading, "the leader lost the lease to a paused standby"
            time.sleep(0.1)
        assert store.is_processed("$while-paused")
        # Resumed, the standby finds its connection gone, reconnects and stands by.
        time.sleep(max(0.0, began + TTL_SECONDS + 6 - time.monotonic()) + 2)
        assert standby._thread.is_alive() and standby.role == "standby" and leader.leading
    finally:
        standby.stop()
        store.close()


class _StoppedAfterEachLook:
    """A standby's lease connection that stops after each read of the lease
    row's expiry, as a process stopped there (SIGSTOP) would, until the test
    has looked at what its session holds."""

    def __init__(self, conn, stops: queue.Queue):
        self._conn, self._stops = conn, stops

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, sql, *args, **kwargs):
        result = self._conn.execute(sql, *args, **kwargs)
        if "FROM askwright_lease" in sql and "expires <" in sql:
            looked = threading.Event()
            self._stops.put(looked)
            looked.wait(0.8)  # (within the lease connection's 1 s idle limit: a lock is still held)
        return result


def test_a_standby_stopped_in_its_look_while_the_lease_runs_holds_nothing_the_leader_waits_for(
        shared, postgres_server):
    # Each look took the row FOR UPDATE, the lease running or not: a standby
    # stopped there held the leader's renewal (and its fenced transactions)
    # until the server ended its session.
    url, lease = shared
    leader = lease()
    wait_for(lambda: leader.leading)
    stops: queue.Queue = queue.Queue()
    standby = Lease(url, postgres_server.password)
    take = standby._try_take
    standby._try_take = lambda conn: take(_StoppedAfterEachLook(conn, stops))
    standby.start()
    try:
        with psycopg.connect(url, password=postgres_server.password, autocommit=True) as probe:
            for _look in range(5):
                looked = stops.get(timeout=10)
                try:
                    # The lock the leader's renewal (an UPDATE) takes, not waited for.
                    running = probe.execute("SELECT expires > clock_timestamp() FROM askwright_lease"
                                            " WHERE name = 'leader' FOR NO KEY UPDATE NOWAIT").fetchone()[0]
                except psycopg.errors.LockNotAvailable:
                    pytest.fail("a standby stopped in its look holds the lease row: the leader's renewal waits")
                finally:
                    looked.set()
                assert running and leader.leading
    finally:
        standby.stop()
    assert leader.leading and standby.role == "standby"


@pytest.mark.parametrize("operators_options", ["", "-c lock_timeout=5000"], ids=["as shipped", "lock_timeout set"])
def test_an_old_leaders_session_stuck_holding_the_lease_row_is_ended_and_the_standby_takes_over(
        shared, postgres_server, operators_options):
    # The old leader's store session, fenced and busy for good: as when its
    # process froze while the server was sending it a result (no timeout of
    # the server's applies to that, and it cannot be cancelled).  An
    # operator's lock_timeout in the URL (operators.md's own example) also
    # set the lease's: the round's bound cut the wait before it failed as a
    # lock's, the stuck session was never ended, and nobody led.
    url, lease = shared
    if operators_options:
        from psycopg.conninfo import make_conninfo

        url = make_conninfo(url, options=f"{conninfo_to_dict(url)['options']} {operators_options}")
    old = lease(url, ttl=2)
    wait_for(lambda: old.leading)
    search_path = conninfo_to_dict(url)["options"]
    stuck = psycopg.connect(url, password=postgres_server.password, application_name="askwright-bridge store",
                            options=f"{search_path} -c statement_timeout=0")
    stuck.execute("SELECT 1 FROM askwright_lease WHERE name = 'leader' FOR KEY SHARE")
    threading.Thread(target=lambda: _quietly(stuck.execute, "SELECT pg_sleep(60)"), daemon=True).start()
    freeze(old)
    new = lease(url, ttl=2)
    assert wait_for(lambda: new.leading, timeout=2 + 8) < 2 + 8
    assert new.epoch == old.epoch + 1
    wait_for(lambda: stuck.closed or stuck.broken)


def test_an_old_leaders_store_session_that_began_after_the_lease_ran_out_is_ended_too(shared, postgres_server):
    """The old leader's BEGIN and fence reach the server with its first
    statement: on a starved machine, after its lease ran out.  Spared as
    begun after the expiry, its session stuck holding the row kept every
    standby out for good."""
    url, lease = shared
    old = lease(ttl=2)
    wait_for(lambda: old.leading)
    freeze(old)
    expired = "SELECT expires < clock_timestamp() FROM askwright_lease WHERE name = 'leader'"
    with psycopg.connect(url, password=postgres_server.password, autocommit=True) as look:
        wait_for(lambda: look.execute(expired).fetchone()[0], timeout=5)
    search_path = conninfo_to_dict(url)["options"]
    stuck = psycopg.connect(url, password=postgres_server.password, application_name="askwright-bridge store",
                            options=f"{search_path} -c statement_timeout=0")
    stuck.execute("SELECT 1 FROM askwright_lease WHERE name = 'leader' FOR KEY SHARE")
    threading.Thread(target=lambda: _quietly(stuck.execute, "SELECT pg_sleep(60)"), daemon=True).start()
    new = lease(ttl=2)
    assert wait_for(lambda: new.leading, timeout=2 + 8) < 2 + 8
    wait_for(lambda: stuck.closed or stuck.broken)


def _quietly(call, *args) -> None:
    try:
        call(*args)
    except psycopg.Error:
        pass  # ended by the server: what the test wants


def leader_and_successor(shared, postgres_server) -> tuple[Lease, Lease, Store]:
    """A leader whose store is fenced by its lease, and an instance waiting to take over."""
    url, lease = shared
    old = lease(ttl=1)
    wait_for(lambda: old.leading)
    store = Store("unused", url=url, password=postgres_server.password)
    old.guard_store(store)
    return old, lease(ttl=1), store


def test_a_takeover_waits_for_the_old_leaders_open_transaction(shared, postgres_server):
    old, new, store = leader_and_successor(shared, postgres_server)
    with store.transaction():
        freeze(old)
        store.mark_processed("$in-flight", "accepted")
        # A statement that waits: the transaction's BEGIN and fence go out with it.
        assert not store.is_processed("$another")
        time.sleep(2.0)  # the lease expired meanwhile, but this transaction holds its row
        assert not new.leading
    wait_for(lambda: new.leading)
    assert store.is_processed("$in-flight")


def test_a_leader_frozen_inside_a_store_transaction_is_taken_over_when_its_lease_runs_out(shared, postgres_server):
    # The transaction's statements went out together (BEGIN, the fence, a
    # write and a read in one round trip), then the process froze.  The
    # server ends a session idle inside a transaction after 3 s only when
    # the last thing it read was a Sync, and a pipelined round trip ends
    # with a flush request after it: the session sat "idle in transaction"
    # for good, and the standby waited out the lease row's lock (2 s) before
    # ending it, 7 s after the freeze instead of the lease's 4.
    url, lease = shared
    old = lease()
    wait_for(lambda: old.leading)
    store = Store("unused", url=url, password=postgres_server.password)
    old.guard_store(store)
    try:
        store.db.execute("BEGIN IMMEDIATE")
        store.mark_processed("$frozen", "accepted")
        assert not store.is_processed("$another")  # one round trip: BEGIN, fence, write, read
        freeze(old)  # the whole process stops here: nothing more is sent
        frozen = time.monotonic()
        new = lease()
        wait_for(lambda: new.leading, timeout=TTL_SECONDS + 5)
        assert time.monotonic() - frozen < TTL_SECONDS + 1.5
        with pytest.raises(sqlite3.OperationalError):  # resumed: its session was ended, nothing committed
            store.db.execute("COMMIT")
    finally:
        store.close()
    after = Store("unused", url=url, password=postgres_server.password)
    assert not after.is_processed("$frozen")
    after.close()


def test_a_transaction_that_sent_nothing_before_its_lease_was_taken_over_commits_nothing(shared, postgres_server):
    old, new, store = leader_and_successor(shared, postgres_server)
    with pytest.raises(LeaseLost):
        with store.transaction():
            freeze(old)
            store.mark_processed("$late", "accepted")  # a write nobody waits on: not sent yet
            wait_for(lambda: new.leading)
    assert not store.is_processed("$late")


def test_a_leader_that_lost_the_lease_downloads_nothing():
    import asyncio

    from bridge.service.storage.leader import _Guarded
    from bridge.service.transport.matrix import NioTransport

    opened = []

    class Client:
        access_token = "t"

        async def send(self, *args, **kwargs):
            opened.append(args)
            raise AssertionError("the homeserver was asked")

    def lost() -> None:
        raise LeaseLost("another instance leads")

    async def download() -> None:
        async with _Guarded(NioTransport(Client()), lost).download("mxc://hs/abc", 1.0):
            pass

    with pytest.raises(LeaseLost):
        asyncio.run(download())
    assert opened == []


def test_a_leader_cut_off_from_the_database_stops_writing_and_a_standby_takes_over(shared, postgres_server):
    url, lease = shared
    cable = Cable(postgres_server.port)
    old = lease(ttl=2, url=url.replace(f":{postgres_server.port}/", f":{cable.port}/"))
    wait_for(lambda: old.leading)
    new = lease(ttl=2)
    cable.sever()
    wait_for(lambda: not old.leading, timeout=2 + 3)
    with pytest.raises(LeaseLost):
        old.check()
    wait_for(lambda: new.leading, timeout=2 + 5)
    assert old.role == "standby"
    # The network comes back, but not the connections it carried (a NAT that
    # lost its state): the cut-off instance, which heard nothing, gave its
    # connection up, made a new one, and stands by.
    cable.mend()
    wait_for(lambda: any(row["id"] == old.name and row["seen_seconds_ago"] < 1
                         for row in instances(url, postgres_server.password)), timeout=10)
    assert old._thread.is_alive() and old.role == "standby" and new.leading


def test_a_session_no_instance_owns_holding_the_lease_row_is_named_while_nobody_leads(shared, postgres_server):
    """An operator's psql left in a transaction over the lease row: no
    instance can lead (the bridge ends only its own stuck sessions), and
    ``store_unreachable`` said nothing once the lease's look came back; it
    names the session until it ends, and the lease is taken right after."""
    url, lease = shared
    search_path = conninfo_to_dict(url)["options"]
    psql = psycopg.connect(url, password=postgres_server.password, application_name="psql", options=search_path)
    for statement in LEASE_TABLES:
        psql.execute(statement)
    psql.execute("INSERT INTO askwright_lease(name, epoch, holder, expires) VALUES ('leader', 0, '', '-infinity')"
                 " ON CONFLICT DO NOTHING")
    psql.commit()
    psql.execute("SELECT * FROM askwright_lease WHERE name = 'leader' FOR UPDATE")  # and left open
    try:
        standby = lease(ttl=2)
        wait_for(lambda: standby.unreached() is not None and "no bridge instance" in standby.unreached()[1])
        time.sleep(4)  # looks that reach the database do not wipe it
        seconds, why = standby.unreached()
        assert not standby.leading and seconds >= 4
        assert f"(pid {psql.info.backend_pid}, application 'psql'" in why and "until it ends" in why
    finally:
        psql.close()
    wait_for(lambda: standby.leading)
    assert standby.unreached() is None


def test_store_unreachable_says_the_latest_failure_since_the_first(shared, postgres_server):
    """An outage whose cause changes (the path cut, then the server refusing
    connections) is told by its latest cause, timed from its beginning:
    the first cause stood for the whole outage."""
    url, lease = shared
    cable = Cable(postgres_server.port)
    cut_off = lease(ttl=2, url=url.replace(f":{postgres_server.port}/", f":{cable.port}/"))
    wait_for(lambda: cut_off.leading)
    cable.sever()
    wait_for(lambda: cut_off.unreached() is not None, timeout=10)
    first = cut_off.unreached()[1]
    cable.refuse()
    wait_for(lambda: "refused" in cut_off.unreached()[1].lower(), timeout=15)
    seconds, why = cut_off.unreached()
    assert why != first and seconds >= 2


async def test_a_leaders_health_says_standby_once_its_lease_runs_out_not_once_it_has_wound_down(shared):
    """A leader whose renewals stop (its database paused or cut off) steps
    down only once the work stuck on the database gives up, twenty seconds
    later in a probe; meanwhile /health said ready leader, and HAProxy kept
    routing to it.  It says what the lease says now."""
    from aiohttp.test_utils import TestClient, TestServer

    from bridge.service.operators.health import health_app
    from bridge.service.operators.metrics import Metrics

    _url, lease = shared
    leader = lease()
    assert wait_for(lambda: leader.leading)
    metrics = Metrics()
    metrics.follow_lease(lambda: leader.leading)
    metrics.mark_ready()
    client = TestClient(TestServer(health_app(metrics)))
    await client.start_server()
    try:
        response = await client.get("/health")
        assert (response.status, (await response.json())["role"]) == (200, "leader")
        freeze(leader)
        await asyncio.sleep(TTL_SECONDS)  # the lease runs out; nothing has told the bridge to stop yet
        response = await client.get("/health")
        assert (response.status, (await response.json())["role"]) == (503, "standby")
        body = await (await client.get("/metrics")).text()
        assert "askwright_bridge_standby 1.0" in body and "askwright_bridge_ready 0.0" in body
    finally:
        await client.close()


def test_a_leader_steps_down_for_good_when_a_newer_version_migrates_the_store(shared, postgres_server):
    # This version's instances, come the next release: a newer one that
    # migrated the store beside them must not find them still writing.
    from bridge.service.storage.schema import SCHEMA_VERSION

    url, lease = shared
    mine = lease(ttl=2)
    wait_for(lambda: mine.leading)
    with psycopg.connect(url, password=postgres_server.password, autocommit=True) as db:
        db.execute("CREATE TABLE askwright_schema (id INTEGER PRIMARY KEY, version INTEGER NOT NULL)")
        db.execute("INSERT INTO askwright_schema VALUES (1, %s)", (SCHEMA_VERSION + 1,))
    wait_for(lambda: not mine.leading, timeout=5)
    time.sleep(TTL_SECONDS + 1)  # its lease ran out: it would take it again if it could
    assert not mine.leading
    with pytest.raises(LeaseLost):
        mine.check()


async def test_a_standbys_health_says_the_database_cannot_be_reached(shared, postgres_server):
    # With PostgreSQL frozen or out of connection slots, every instance
    # answered {"ready": false, "role": "standby"}: no leader, and no reason.
    from aiohttp.test_utils import TestClient, TestServer

    from bridge.service.operators.health import health_app
    from bridge.service.storage.standby import standby_metrics

    url, lease = shared
    cable = Cable(postgres_server.port)
    standby = lease(ttl=2, url=url.replace(f":{postgres_server.port}/", f":{cable.port}/"))
    client = TestClient(TestServer(health_app(standby_metrics(standby))))
    await client.start_server()
    try:
        await asyncio.to_thread(wait_for, lambda: standby.leading)
        assert "store_unreachable" not in await (await client.get("/health")).json()
        cable.sever()
        await asyncio.to_thread(wait_for, lambda: standby.unreached() is not None, 15)
        await asyncio.sleep(1)
        body = await (await client.get("/health")).json()
        assert body["role"] == "standby" and body["store_unreachable"]["seconds"] >= 1
        assert body["store_unreachable"]["error"]
        cable.mend()
        await asyncio.to_thread(wait_for, lambda: standby.unreached() is None, 15)
        assert "store_unreachable" not in await (await client.get("/health")).json()
    finally:
        await client.close()
