"""The agents' service layer, config, auth and webhook signing, without a
homeserver: what an agent (or a webhook receiver) would see."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.agents.auth import RateLimiter, agent_for
from bridge.agents.errors import BadRequest, LintFailed, NotFound, TooLarge, Unprocessable
from bridge.agents.outbox import OutboxHook, due
from bridge.agents.owner import OWNER_FILE
from bridge.agents.sets import AgentSets
from bridge.agents.webhooks import signature, verify
from bridge.service.posting.sets import load_set
from bridge.service.config import Agent, ConfigError, parse_config
from bridge.service.storage.store import LogEntry, Store
from helpers.config import GOOD


def one_question(set_id: str = "plan", qid: str = "branch") -> dict:
    return {"askwright": 1, "id": set_id, "title": "Release plan", "questions": [{
        "id": qid, "kind": "choice", "title": "Release branch",
        "question": "Which branch should the release be cut from?", "why": "The cut decides which fixes ship.",
        "options": [{"id": "main", "label": "The main branch"}, {"id": "stable", "label": "The stable branch"}],
        "guess": {"option": "main", "why": "It is what the last release did.", "confidence": "high"}}]}


# -- config --------------------------------------------------------------------------


def test_agent_secrets_come_from_the_environment(tmp_path):
    raw = {**GOOD, "agents": {"release-agent": None, "other": {"token": "file-token-0123456789"}}}
    env = {"ASKWRIGHT_BRIDGE_AGENT_RELEASE_AGENT_TOKEN": "env-token-0123456789",
           "ASKWRIGHT_BRIDGE_AGENT_RELEASE_AGENT_WEBHOOK_SECRET": "env-secret"}
    config = parse_config(raw, base_dir=tmp_path, environ=env)
    assert config.agents["release-agent"].token == "env-token-0123456789"
    assert config.agents["release-agent"].webhook_secret == "env-secret"
    assert config.agents["other"].token == "file-token-0123456789"


@pytest.mark.parametrize("agent, words", [
    ({}, "needs a token"),
    ({"token": "short"}, "at least 16"),
    ({"token": "a-token-long-enough", "webhook_url": "https://x.example/h"}, "webhook_secret"),
    ({"token": "a-token-long-enough", "webhook_url": "ftp://x", "webhook_secret": "s"}, "http"),
])
def test_an_agent_the_bridge_cant_use_is_refused_naming_it(tmp_path, agent, words):
    with pytest.raises(ConfigError, match="agents.a") as caught:
        parse_config({**GOOD, "agents": {"a": agent}}, base_dir=tmp_path, environ={})
    assert words in str(caught.value)


# -- who the agent is --------------------------------------------------------------------


def test_a_bearer_token_names_its_agent_and_nothing_else_does():
    agents = {"a": Agent(token="token-of-a-0123456789"), "b": Agent(token="token-of-b-0123456789")}
    assert agent_for("Bearer token-of-b-0123456789", agents) == "b"
    assert agent_for("Bearer token-of-b-012345678", agents) is None
    assert agent_for("Bearer \udcff\udcfe", agents) is None  # bytes no UTF-8, as aiohttp keeps them: was a 500
    assert agent_for("token-of-a-0123456789", agents) is None
    assert agent_for(None, agents) is None


def test_the_rate_limit_is_per_agent_and_refills():
    now = [0.0]
    limiter = RateLimiter(per_minute=3, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.allow("b")
    now[0] += 20.0  # a third of a minute: one request back
    assert limiter.allow("a") and not limiter.allow("a")


def test_waits_given_back_are_capped_so_waits_dropped_at_once_cannot_multiply_the_budget():
    # A wait held and dropped (its connection closed, a short timeout), over
    # and over, was given back each time: 1,000 requests in 10 s, each
    # reading the set, on a budget of 120 a minute.
    now = [0.0]
    limiter = RateLimiter(per_minute=3, clock=lambda: now[0], refunds_per_minute=5)
    allowed = 0
    for _ in range(100):
        if limiter.allow("a"):
            allowed += 1
            limiter.give_back("a")
    assert allowed == 3 + 5
    now[0] += 60.0  # a minute on: the budget and the refunds are back
    assert sum(limiter.allow("a") and (limiter.give_back("a") or True) for _ in range(100)) == 3 + 5


def test_a_webhook_signature_checks_out_only_unchanged_and_recent():
    body = b'{"type": "answer.accepted"}'
    header = signature("s3cret", 1_000_000, body)
    assert header.startswith("t=1000000,v1=")
    assert verify("s3cret", header, body, now=1_000_010)
    assert not verify("s3cret", header, body + b" ", now=1_000_010)
    assert not verify("other", header, body, now=1_000_010)
    assert not verify("s3cret", header, body, now=1_000_000 + 3600)  # a replay, an hour later


# -- the service ------------------------------------------------------------------------


def test_ask_writes_the_set_whole_with_its_owner_and_read_is_reads_shape(tmp_path):
    sets = AgentSets(tmp_path)
    asked = sets.ask("a", "plan", json.dumps(one_question()).encode())
    assert (asked.created, asked.open_questions) == (True, ["branch"])
    assert json.loads((tmp_path / "plan" / OWNER_FILE).read_text())["agent"] == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["plan"]  # no staging folder left
    assert sets.ask("a", "plan", one_question()).created is False
    cli = subprocess.run([sys.executable, "-m", "bridge", "read", str(tmp_path / "plan"), "--all"],
                         capture_output=True, text=True, check=True)
    assert sets.read("a", "plan", include_all=True) == json.loads(cli.stdout)
    assert sets.list_sets("a") == [{"set": "plan", "rev": 0, "open": 1, "answered": 0}]
    assert sets.list_sets("b") == []


def test_a_set_over_the_formats_16_mb_as_written_is_refused_whatever_door_it_came_by(tmp_path):
    """A document that came as JSON inside an envelope or through MCP was
    never measured: a 17 MB set was written, then never posted (the poster
    refuses such a file) while the agent waited on it for ever.  At the real
    size: a set of closed questions with long whys around one open question."""

    def with_history(questions: int) -> dict:
        document = one_question()
        document["questions"] += [{"id": f"old{n}", "kind": "text", "title": f"Old {n}", "question": f"What about {n}?",
                                   "why": "It mattered then. " * 850, "status": "closed",
                                   "guess": {"text": "Fine.", "why": "As before.", "confidence": "low"}}
                                  for n in range(questions)]
        return document

    sets = AgentSets(tmp_path)
    with pytest.raises(TooLarge, match="larger than the format allows") as caught:
        sets.ask("a", "plan", with_history(1100))  # 17.1 MB as written
    assert caught.value.status == 413
    assert list(tmp_path.iterdir()) == []
    sets.ask("a", "plan", with_history(1000))  # 15.6 MB: within the format
    assert 15_000_000 < (tmp_path / "plan" / "questions.json").stat().st_size < 16 * 1024 * 1024


def test_a_set_within_16_mb_is_taken_though_indenting_it_would_pass_that(tmp_path):
    """The bridge indents what it writes: a compact 12.8 MB set grew past
    16 MB that way and was refused, though an agent could write those very
    bytes into its folder.  Written compact then, and read back whole."""
    from bridge.questionset.setdir import load_set_dir

    document = one_question()
    document["archive"] = list(range(1_500_000))  # an unknown field: kept, warned about
    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", document)
    written = (tmp_path / "plan" / "questions.json").stat().st_size
    assert 10_000_000 < written < 16 * 1024 * 1024
    assert len(json.dumps(document, indent=2)) > 16 * 1024 * 1024
    assert load_set_dir(tmp_path / "plan", probe=False).ok
    # A close rewrites it: as the bridge writes a set, not indented past 16 MB (unreadable then).
    sets.close("a", "plan", ["branch"], "closed", None)
    assert (tmp_path / "plan" / "questions.json").stat().st_size < 16 * 1024 * 1024
    assert json.loads((tmp_path / "plan" / "questions.json").read_text())["questions"][0]["status"] == "closed"


def test_another_agents_set_and_a_hand_written_set_are_not_there(tmp_path):
    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question())
    hand = tmp_path / "by-hand"
    hand.mkdir()
    (hand / "questions.json").write_text(json.dumps(one_question("by-hand")))
    for set_id in ("plan", "by-hand", "none"):
        with pytest.raises(NotFound):
            sets.read("b", set_id)
        with pytest.raises(NotFound):
            sets.close("b", set_id, None, "closed", None)
    # An id that can't be a set's is a bad request on every route, naming it.
    for call in (lambda: sets.read("a", "../plan"), lambda: sets.close("a", "../plan", None, "closed", None),
                 lambda: sets.ask("a", "../plan", one_question("../plan"))):
        with pytest.raises(BadRequest, match="^id: not a set id"):
            call()
    with pytest.raises(NotFound):
        sets.ask("b", "plan", one_question())
    with pytest.raises(NotFound):
        sets.ask("a", "by-hand", one_question("by-hand"))
    assert json.loads((tmp_path / "plan" / OWNER_FILE).read_text())["agent"] == "a"


def test_a_set_failing_lint_is_refused_with_the_findings_and_nothing_written(tmp_path):
    sets = AgentSets(tmp_path)
    bad = one_question()
    bad["questions"][0]["question"] = "No question mark"
    with pytest.raises(LintFailed) as caught:
        sets.ask("a", "plan", bad)
    assert [f["where"] for f in caught.value.findings] == ["questions[branch].question"]
    with pytest.raises(LintFailed, match="id in the address"):
        sets.ask("a", "other-id", one_question())
    with pytest.raises(BadRequest, match="not JSON"):
        sets.ask("a", "plan", b"{nope")
    assert list(tmp_path.iterdir()) == []


def test_an_agent_lowering_a_rev_the_bridge_posted_is_warned_as_lint_warns(tmp_path):
    posted: dict[str, dict[str, int]] = {}
    sets = AgentSets(tmp_path, posted_revs=lambda: posted)
    assert sets.ask("a", "plan", one_question()).warnings == []
    posted[os.path.realpath(tmp_path / "plan")] = {"branch": 2}  # the bridge posted rev 2 meanwhile
    asked = sets.ask("a", "plan", one_question())  # rev 1 again
    assert [(w["where"], "rev went back from 2 to 1" in w["message"]) for w in asked.warnings] == \
        [("questions[branch].rev", True)]


def test_an_agent_changing_a_posted_question_without_a_new_rev_is_warned(tmp_path):
    """The words changed, the rev left as posted: the agent got 200 and no
    word, the room kept the old question, and read showed the answer to it
    under the new words."""
    posted: dict[str, dict[str, int]] = {}
    sets = AgentSets(tmp_path, posted_revs=lambda: posted)
    sets.ask("a", "plan", one_question())
    changed = one_question()
    changed["questions"][0]["question"] = "Which branch now, really?"
    assert sets.ask("a", "plan", changed).warnings == []  # not posted yet: the new words are the ones posted
    posted[os.path.realpath(tmp_path / "plan")] = {"branch": 1}
    changed["questions"][0]["title"] = "The branch, again"
    (warning,) = sets.ask("a", "plan", changed).warnings
    assert warning["where"] == "questions[branch].rev"
    assert warning["message"].startswith("title changed, but rev is still 1, which the bridge has posted")
    assert "raise rev to 2" in warning["message"]
    changed["questions"][0]["rev"] = 2  # asked anew: nothing to warn of
    assert sets.ask("a", "plan", changed).warnings == []
    assert sets.ask("a", "plan", changed).warnings == []  # the same again: no change


def test_closing_the_last_question_finishes_the_set_and_the_poster_still_takes_it(tmp_path):
    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question())
    with pytest.raises(BadRequest, match="reason"):
        sets.close("a", "plan", None, "withdrawn", "  ")
    with pytest.raises(Unprocessable):
        sets.close("a", "plan", ["nope"], "closed", None)
    assert sets.close("a", "plan", None, "withdrawn", "Decided elsewhere")["closed"] == ["branch"]
    question = json.loads((tmp_path / "plan" / "questions.json").read_text())["questions"][0]
    assert (question["status"], question["reason"]) == ("withdrawn", "Decided elsewhere")
    model, errors = load_set(tmp_path / "plan")
    assert errors == [] and model is not None and not model.questions[0].is_open
    assert sets.close("a", "plan", None, "closed", None)["closed"] == []  # nothing open any more


# -- the outbox -------------------------------------------------------------------------


def test_the_outbox_row_commits_or_rolls_back_with_the_answer(tmp_path):
    sets = AgentSets(tmp_path / "sets")
    sets.ask("a", "plan", one_question(), callbacks=["https://hooks.example/a"])
    store = Store(tmp_path / "store.sqlite")
    hook = OutboxHook(store, {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}, clock=lambda: 5.0)
    entry = LogEntry("$answer", "!room", "@p:hs", "answer_event", "accepted", set_id="plan",
                     set_dir=str(tmp_path / "sets" / "plan"), qid="branch", record={"choice": "main"})
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.append_log(entry)
            hook(entry)
            raise RuntimeError("the batch fails after the hook")
    assert due(store, 10_000) == []
    with store.transaction():
        store.append_log(entry)
        hook(entry)
        hook(entry)  # the same entry twice is one delivery
    (row,) = due(store, 10_000)
    assert (row.key, row.url, row.agent) == ("answer.accepted:$answer", "https://hooks.example/a", "a")
    body = json.loads(row.body)
    assert (body["type"], body["set"], body["qid"], body["record"]["choice"]) == ("answer.accepted", "plan",
                                                                                  "branch", "main")
    store.close()


def test_an_answer_to_a_set_without_an_agent_queues_nothing(tmp_path):
    store = Store(tmp_path / "store.sqlite")
    hand = tmp_path / "by-hand"
    hand.mkdir()
    hook = OutboxHook(store, {"a": Agent(token="token-of-a-0123456789", webhook_url="https://h.example",
                                         webhook_secret="s")})
    with store.transaction():
        hook(LogEntry("$x", "!r", "@p:hs", "answer_event", "accepted", set_dir=str(hand), qid="q"))
    assert due(store, 2**62) == []
    store.close()


def test_the_openapi_document_is_shipped_and_names_every_route():
    doc = json.loads((Path(__file__).resolve().parents[2] / "bridge" / "agents" / "openapi.json").read_text())
    assert set(doc["paths"]) == {"/v1/sets", "/v1/sets/{id}", "/v1/sets/{id}/answers", "/v1/sets/{id}/close",
                                 "/v1/sets/{id}/attachments/{name}", "/v1/sets/{id}/media/{name}",
                                 "/v1/openapi.json", "/v1/log/checkpoint", "/v1/log/inclusion",
                                 "/v1/log/consistency", "/v1/log/leaves"}
    media = doc["paths"]["/v1/sets/{id}/media/{name}"]["put"]
    assert list(media["requestBody"]["content"]) == ["application/octet-stream"]
    # The names the document promises are exactly the names the code takes.
    from bridge.agents import attachment_files, media_files

    assert media["parameters"][1]["schema"]["pattern"] == media_files.NAME_PATTERN
    attachment = doc["paths"]["/v1/sets/{id}/attachments/{name}"]["get"]
    assert attachment["parameters"][1]["schema"]["pattern"] == attachment_files.NAME.pattern
    assert set(doc["paths"]["/v1/sets/{id}"]["put"]["responses"]) >= {"200", "201", "401", "404", "413", "422"}


def test_a_question_closed_in_the_store_queues_its_webhook_in_the_same_transaction(tmp_path):
    from bridge.protocol.recorded import RecordedQuestion

    sets = AgentSets(tmp_path / "sets")
    sets.ask("a", "plan", one_question())
    store = Store(tmp_path / "store.sqlite")
    question = RecordedQuestion("$q", "!room", "plan", {"question": {"id": "branch", "rev": 2, "title": "T"},
                                                        "elicitation_id": "e1"})
    with store.transaction():
        store.record_posted(question, set_dir=str(tmp_path / "sets" / "plan"), posted_at=0)
    hook = OutboxHook(store, {"a": Agent(token="token-of-a-0123456789", webhook_url="https://h.example/a",
                                         webhook_secret="s")})
    with store.transaction():
        store.close_question("$q")
        hook.closed(question, "withdrawn (Decided)")
    (row,) = due(store, 2**62)
    body = json.loads(row.body)
    assert (body["type"], body["qid"], body["q_rev"], body["why"]) == ("question.closed", "branch", 2,
                                                                      "withdrawn (Decided)")
    store.close()


async def test_a_webhook_never_taken_is_retried_then_dropped_with_a_log_line_and_a_metric(tmp_path, caplog):
    import asyncio
    import logging

    from aiohttp import web

    from bridge.agents.webhooks import Deliverer
    from bridge.service.operators.metrics import Metrics

    seen: list[str] = []

    async def refuse(request: web.Request) -> web.Response:
        seen.append(request.headers["Idempotency-Key"])
        return web.Response(status=503)

    app = web.Application()
    app.router.add_post("/hook", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # the port the system picked
    sets = AgentSets(tmp_path / "sets")
    sets.ask("a", "plan", one_question(), callbacks=[f"http://127.0.0.1:{port}/hook"])
    store = Store(tmp_path / "store.sqlite")
    agents = {"a": Agent(token="token-of-a-0123456789", webhook_secret="s")}
    with store.transaction():
        OutboxHook(store, agents)(LogEntry("$answer", "!r", "@p:hs", "answer_event", "accepted", set_id="plan",
                                           set_dir=str(tmp_path / "sets" / "plan"), qid="branch", record={}))
    metrics = Metrics()
    deliverer = Deliverer(store, agents, metrics, drop_after=2.5, timeout=2, allow_private=True)  # a receiver on loopback
    stop = asyncio.Event()
    caplog.set_level(logging.WARNING, logger="bridge.agents.webhooks")
    task = asyncio.ensure_future(deliverer.run(stop))
    try:
        for _ in range(200):
            if not store.db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0]:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
        await runner.cleanup()
    assert store.db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0] == 0
    assert len(seen) >= 2 and set(seen) == {"answer.accepted:$answer"}  # retried, same key every time
    exposition = metrics.exposition().decode()
    assert "askwright_bridge_webhooks_dropped_total 1.0" in exposition
    assert "askwright_bridge_webhooks_delivered_total 0.0" in exposition
    assert any("dropped" in r.getMessage() and "127.0.0.1" in r.getMessage() for r in caplog.records)
    store.close()


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # the 2025 era on purpose
async def test_a_connection_that_ends_leaves_no_subscription_behind(tmp_path):
    # A session that subscribed and then ended (DELETE, an idle timeout, the
    # client gone) stayed in the subscribers for good: about 24 KB each, 46 MB
    # per 2,000 sessions, never given back.
    from mcp import Client

    from bridge.agents.mcp_server import Subscribers, build_server

    sets = AgentSets(tmp_path)
    for set_id in ("plan", "ship"):
        sets.ask("a", set_id, one_question(set_id))
    subscribers = Subscribers(sets.owner_of)
    server = build_server(sets, {"a": Agent(token="token-of-a-0123456789")}, lambda _ctx: "a", subscribers)
    for _session in range(3):
        async with Client(server, mode="legacy") as client:
            for set_id in ("plan", "ship"):
                await client.session.subscribe_resource(f"askwright://sets/{set_id}/answers")
            assert len(subscribers.sessions) == 2
    assert subscribers.sessions == {}
    await subscribers.changed("plan")  # nobody left to tell, nothing raised


async def test_whose_set_changed_is_read_off_the_event_loop(tmp_path):
    """Telling subscribers of a change reads the set's owner file; on a slow
    disk (a network share, a disk under load) that read stopped every room,
    the agents' API and /health until it returned."""
    import threading

    from bridge.agents.mcp_server import Subscribers

    loop_ran = threading.Event()

    def slow_owner_of(_set_id: str) -> str | None:
        # Returns once the loop has run something else meanwhile, or gives up.
        return "a" if loop_ran.wait(5) else None

    subscribers = Subscribers(slow_owner_of)
    told = asyncio.ensure_future(subscribers.changed("plan"))
    await asyncio.sleep(0)
    loop_ran.set()  # the loop is free while the owner is read
    await told
    assert subscribers._owners == {"askwright://sets/plan/answers": "a"}


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # the 2025 era on purpose
async def test_a_resource_subscription_is_one_per_connection_and_ends_with_unsubscribe(tmp_path):
    import asyncio

    import mcp_types as types
    from mcp import Client

    from bridge.agents.mcp_server import Subscribers, build_server

    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question())
    subscribers = Subscribers(sets.owner_of)
    server = build_server(sets, {"a": Agent(token="token-of-a-0123456789")}, lambda _ctx: "a", subscribers)
    told: list[str] = []

    async def notices(message: object) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            told.append(str(message.params.uri))

    uri = "askwright://sets/plan/answers"
    async with Client(server, mode="legacy", message_handler=notices) as client:
        await client.session.subscribe_resource(uri)
        await client.session.subscribe_resource(uri)
        await subscribers.changed("plan")
        for _ in range(100):
            if told:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # a second notice (a second subscription) would be here by now
        assert told == [uri]
        await client.session.unsubscribe_resource(uri)
        await subscribers.changed("plan")
        await asyncio.sleep(0.2)
        assert told == [uri]
        with pytest.raises(Exception, match="no set"):
            await client.session.subscribe_resource("askwright://sets/theirs/answers")


async def test_one_agents_listen_streams_are_held_as_its_waits_and_leave_others_their_own(tmp_path):
    """subscriptions/listen streams shared one limit of 1024 for every agent:
    one token holding them all had every other agent's listen refused."""
    import contextlib

    from mcp import Client
    from mcp.shared.exceptions import MCPError

    from bridge.agents.mcp_server import Subscribers, build_server

    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question("plan"))
    sets.ask("b", "ship", one_question("ship"))
    sets.waits.per_agent = 2
    agents = {"a": Agent(token="token-of-a-0123456789"), "b": Agent(token="token-of-b-0123456789")}
    subscribers = Subscribers(sets.owner_of)
    as_a = build_server(sets, agents, lambda _ctx: "a", subscribers)
    as_b = build_server(sets, agents, lambda _ctx: "b", subscribers)
    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(Client(as_a, mode="2026-07-28"))
        b = await stack.enter_async_context(Client(as_b, mode="2026-07-28"))
        for _stream in range(2):
            await stack.enter_async_context(a.listen(resource_subscriptions=["askwright://sets/plan/answers"]))
        with pytest.raises(MCPError) as over:
            async with a.listen(resource_subscriptions=["askwright://sets/plan/answers"]):
                pass
        # A refusal to retry (the door's code, the wait tool's error), not -32603 "Internal error".
        assert over.value.code == -32010 and "max_waits" in over.value.message
        assert over.value.data == {"error": "too_many_waits", "retry_after": 5}
        async with b.listen(resource_subscriptions=["askwright://sets/ship/answers"]) as theirs:
            assert [str(u) for u in theirs.honored.resource_subscriptions] == ["askwright://sets/ship/answers"]
    assert sum(sets.waits.held.values()) == 0  # each stream gave its place back as it ended

@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # the 2025 era on purpose
async def test_a_set_id_another_agent_takes_over_is_not_told_to_the_first_agents_subscriptions(tmp_path):
    """Subscriptions were kept by set id: once agent a's set was removed and
    agent b put a set of the same id, a's subscription (and listen stream)
    heard every change of b's answers.  The removal itself is still told
    to a's own subscriptions."""
    import contextlib
    import shutil

    import mcp_types as types
    from mcp import Client

    from bridge.agents.mcp_server import Subscribers, build_server

    sets = AgentSets(tmp_path)
    sets.ask("a", "plan", one_question("plan"))
    agents = {"a": Agent(token="token-of-a-0123456789"), "b": Agent(token="token-of-b-0123456789")}
    subscribers = Subscribers(sets.owner_of)
    uri = "askwright://sets/plan/answers"
    told: dict[str, list[str]] = {"a": [], "b": []}

    def notices(agent: str):
        async def handler(message: object) -> None:
            if isinstance(message, types.ResourceUpdatedNotification):
                told[agent].append(str(message.params.uri))
        return handler

    def server(agent: str):
        return build_server(sets, agents, lambda _ctx: agent, subscribers)

    async def heard(stream) -> bool:
        try:
            await asyncio.wait_for(stream.__anext__(), 0.5)
            return True
        except asyncio.TimeoutError:
            return False

    async with contextlib.AsyncExitStack() as stack:
        old_a = await stack.enter_async_context(Client(server("a"), mode="legacy", message_handler=notices("a")))
        await old_a.session.subscribe_resource(uri)
        new_a = await stack.enter_async_context(Client(server("a"), mode="2026-07-28"))
        stream_a = await stack.enter_async_context(new_a.listen(resource_subscriptions=[uri]))

        shutil.rmtree(tmp_path / "plan")  # a's set removed: a hears that last change, as before
        await subscribers.changed("plan")
        assert await heard(stream_a)
        await asyncio.sleep(0.2)
        assert told == {"a": [uri], "b": []}

        sets.ask("b", "plan", one_question("plan"))  # and b puts one of the same id
        old_b = await stack.enter_async_context(Client(server("b"), mode="legacy", message_handler=notices("b")))
        await old_b.session.subscribe_resource(uri)
        new_b = await stack.enter_async_context(Client(server("b"), mode="2026-07-28"))
        stream_b = await stack.enter_async_context(new_b.listen(resource_subscriptions=[uri]))

        await subscribers.changed("plan")  # b's answers change (as the folder watcher tells it)
        assert await heard(stream_b)
        assert not await heard(stream_a)
        await asyncio.sleep(0.2)
        assert told == {"a": [uri], "b": [uri]}


async def test_a_big_sets_close_and_listing_are_worked_out_in_a_process_and_a_listing_reads_only_what_changed(
        tmp_path, monkeypatch):
    # In the agents' threads, a big set's parse, lint and JSON held the
    # interpreter's lock: an agent closing or listing its 3 MB set (within its
    # budget) held /health and every other agent up to 430 ms at a time.
    from bridge.agents import sets as sets_module

    sets = AgentSets(tmp_path)
    big = one_question("big")
    template = big["questions"][0]
    big["questions"] = [{**template, "id": f"q{n}", "title": f"Release branch {n}",
                         "question": f"Which branch should release {n} be cut from?",
                         "guess": {**template["guess"], "option": ("main", "stable")[n % 2]}} for n in range(2000)]
    sets.ask("a", "big", big)
    sets.ask("a", "small", one_question("small"))
    apart: list[str] = []
    real = sets_module.in_a_process

    def noted(fn, *args):
        apart.append(fn.__name__)
        return real(fn, *args)

    monkeypatch.setattr(sets_module, "in_a_process", noted)
    listed = await sets.list_sets_apart("a")
    assert [(s["set"], s["open"]) for s in listed] == [("big", 2000), ("small", 1)]
    assert apart == ["set_summary"]  # the big one alone
    assert await sets.list_sets_apart("a") == listed and apart == ["set_summary"]  # nothing changed: nothing read
    closed = await sets.close_apart("a", "big", ["q7"], "closed", None)
    assert closed["closed"] and apart == ["set_summary", "closed_set"]
    listed = await sets.list_sets_apart("a")
    assert listed[0]["open"] == 1999 and apart == ["set_summary", "closed_set", "set_summary"]


def test_half_a_surrogate_pair_is_refused_at_every_door_and_nothing_is_written(tmp_path):
    """JSON's escapes can spell "\\ud800", UTF-8 can't write it: a set or a close
    reason holding one was a 500 (the write failed) on the HTTP door and an
    internal error over MCP, whose parser hands the bridge a dict."""
    sets = AgentSets(tmp_path)
    document = one_question()
    document["title"] = "Plan \ud800"
    for given in (json.dumps(document).encode(), document):  # the HTTP door's bytes, the MCP door's dict
        with pytest.raises(BadRequest) as refused:
            sets.ask("a", "plan", given)
        assert "half a surrogate pair ('\\ud800')" in refused.value.message
    assert list(tmp_path.iterdir()) == []
    sets.ask("a", "plan", one_question())
    with pytest.raises(BadRequest) as refused:
        sets.close("a", "plan", None, "withdrawn", "no longer \udc00 needed")
    assert "reason: a string holds half a surrogate pair" in refused.value.message
    assert sets.close("a", "plan", None, "withdrawn", "no longer needed")["closed"] == ["branch"]


@pytest.mark.parametrize("number", [float("inf"), float("-inf"), float("nan")])
def test_a_number_json_cannot_write_from_the_mcp_door_is_refused_and_nothing_is_written(tmp_path, number):
    """The MCP SDK reads 1e400 as infinity and hands the bridge a dict: the
    set was written with Infinity, which no reader takes (never posted,
    listed or read again)."""
    sets = AgentSets(tmp_path)
    document = one_question()
    document["x_big"] = number
    with pytest.raises(BadRequest) as refused:
        sets.ask("a", "plan", document)
    assert "a number JSON cannot hold" in refused.value.message
    assert list(tmp_path.iterdir()) == []


async def test_a_set_of_few_questions_and_a_big_answers_json_is_read_once_off_the_loop_for_all_its_waits(
        tmp_path, monkeypatch):
    """160 questions, answers of 20,000 characters: a 10 MB answers.json.
    Only questions.json's size counted: every wait parsed the file on the
    event loop, each keeping its own copy (100 waits: 8.5 s stalled, 2.5 GB)."""
    from bridge.answers import document
    from bridge.answers.file import AnswersFile

    sets = AgentSets(tmp_path)
    sets.ask("a", "wordy", one_question("wordy"))
    words = "a long considered answer " * 800  # 20,000 characters
    records = [{"qid": "branch", "text": words, "note": words, "q_rev": 1}]
    AnswersFile(tmp_path / "wordy", "wordy").update(lambda doc, now: document.put_record(doc, records[0], now),
                                                    "2026-12-01T10:00:00.000Z")
    doc = json.loads((tmp_path / "wordy" / "answers.json").read_text())
    doc["padding"] = "x" * (400 * 1024)  # past BIG_DOCUMENT, as many such answers make it
    (tmp_path / "wordy" / "answers.json").write_text(json.dumps(doc))
    apart: list[str] = []

    async def noted(agent, fn, *args):
        apart.append(args[0].__name__)
        return fn(*args)

    monkeypatch.setattr(sets.apart, "run", noted)
    views = await asyncio.gather(*(sets.read_all_apart("a", "wordy") for _ in range(20)))
    assert apart == ["_view"] and all(v == views[0] for v in views)


def test_the_owner_of_a_folder_being_removed_is_not_forgotten_before_its_closes(tmp_path):
    """rm -r took the owner file first; the agent's PUT, answered meanwhile,
    read the owner again and found none: the closes of the folder removed
    went to nobody (no webhook, though the agent had one)."""
    from bridge.protocol.recorded import RecordedQuestion
    import shutil

    sets = AgentSets(tmp_path / "sets")
    sets.ask("a", "plan", one_question())
    set_dir = str(tmp_path / "sets" / "plan")
    store = Store(tmp_path / "store.sqlite")
    question = RecordedQuestion("$q", "!room", "plan", {"question": {"id": "branch", "rev": 1, "title": "T"},
                                                        "elicitation_id": "e1"})
    with store.transaction():
        store.record_posted(question, set_dir=set_dir, posted_at=0)
    hook = OutboxHook(store, {"a": Agent(token="token-of-a-0123456789", webhook_url="https://h.example/a",
                                         webhook_secret="s")})
    hook.posted(question)
    os.unlink(os.path.join(set_dir, OWNER_FILE))  # the removal under way
    hook.owner_written(set_dir)
    shutil.rmtree(set_dir)
    with store.transaction():
        store.close_question("$q")
        hook.closed(question, "this set was removed")
    (row,) = due(store, 2**62)
    assert (row.agent, row.url, json.loads(row.body)["why"]) == ("a", "https://h.example/a", "this set was removed")
    store.close()
