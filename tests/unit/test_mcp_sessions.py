"""Handshake-era session ids (bridge/agents/mcp_sessions.py): any bridge
process with the agents' configuration can tell its own ids, issued to whom."""

from __future__ import annotations

from bridge.agents.mcp_sessions import SessionIds
from bridge.service.config import Agent

AGENTS = {"planner": Agent(token="planner-token-0123456789abcdef"), "other": Agent(token="other-token-0123456789abcdef")}


def test_an_id_is_honoured_by_another_process_for_the_agent_it_was_issued_to_only():
    issued = SessionIds(AGENTS).mint("planner")
    restarted = SessionIds(dict(AGENTS))
    assert restarted.valid(issued, "planner")
    assert not restarted.valid(issued, "other")
    assert not restarted.valid(issued, None)
    assert all(0x21 <= ord(c) <= 0x7E for c in issued)  # visible ASCII, as the transport asks


def test_a_forged_or_mangled_id_is_not_honoured():
    ids = SessionIds(AGENTS)
    issued = ids.mint("planner")
    nonce, mac = issued.split(".")
    assert not ids.valid(f"{nonce}.{'0' * len(mac)}", "planner")
    assert not ids.valid(f"{'0' * len(nonce)}.{mac}", "planner")
    assert not ids.valid(nonce, "planner")
    assert not ids.valid("", "planner")
    assert ids.mint("planner") != issued


def test_a_new_token_ends_the_sessions_issued_under_the_old_one():
    issued = SessionIds(AGENTS).mint("planner")
    rotated = SessionIds({**AGENTS, "planner": Agent(token="a-new-planner-token-0123456789")})
    assert not rotated.valid(issued, "planner")


async def test_a_session_its_client_ended_stays_ended_in_a_restarted_process(tmp_path):
    """docs/agents.md: a session its client ended with DELETE stays ended.
    The ended ids were kept in the process's memory only, so a restarted
    bridge (or a standby that took over) took one up again."""
    from bridge.agents.mcp_sessions import EndedSessions
    from bridge.service.storage.store import Store

    session = SessionIds(AGENTS).mint("planner")
    store = Store(tmp_path / "bridge.sqlite")
    await EndedSessions(store).end(session)
    store.close()
    restarted = Store(tmp_path / "bridge.sqlite")
    try:
        assert await EndedSessions(restarted).ended(session)
        assert not await EndedSessions(restarted).ended(SessionIds(AGENTS).mint("planner"))
    finally:
        restarted.close()


async def test_ended_sessions_are_not_kept_for_good(tmp_path, monkeypatch):
    # Every DELETE kept a row for good, and an agent's token makes any id
    # valid: 2,000 DELETEs, 2,000 rows, at 120 requests a minute 170,000 a day.
    from bridge.agents import mcp_sessions
    from bridge.agents.mcp_sessions import ENDED, KEEP_ENDED_MS, EndedSessions
    from bridge.service.storage.store import Store

    store = Store(tmp_path / "bridge.sqlite")
    now = [1_800_000_000_000]
    monkeypatch.setattr(store.clock, "now_ms", lambda: now[0])
    try:
        ended = EndedSessions(store)
        old = [SessionIds(AGENTS).mint("planner") for _ in range(300)]
        for session in old:
            await ended.end(session)
        assert len(store.meta_with_prefix(ENDED)) == 300
        now[0] += KEEP_ENDED_MS + mcp_sessions.SWEEP_EVERY_MS
        fresh = SessionIds(AGENTS).mint("planner")
        await ended.end(fresh)
        assert [key for key, _ms in store.meta_with_prefix(ENDED)] == [ENDED + fresh]
        assert await EndedSessions(store).ended(fresh)
    finally:
        store.close()
