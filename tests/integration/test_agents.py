"""Agents from anywhere, against the real Synapse and the bridge as its own
process: MCP over stdio and over streamable HTTP, the HTTP API with signed
webhooks (also across a kill -9), and bad input turned away with its status."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import aiohttp
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from helpers.agents import (SECRETS, Receiver, Silent, agents_config, answer, auth, free_port, one_question,
                            start, structured, wait_listener)
from helpers.attack import AS_BOT
from helpers.harness import ROOT, Bridge, Person, answer_content, store_rows, unique

pytestmark = pytest.mark.integration


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")  # the 2025 era on purpose
async def test_mcp_over_stdio_asks_and_waits_for_the_judged_answer(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("stdio")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "bridge", "mcp", "-c", str(bridge.config_path),
                                                                 "--agent", "planner"], env=env, cwd=str(bridge.workdir))
    updated: list[str] = []

    async def notices(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updated.append(str(message.params.uri))

    # The 2025 handshake era here (resources/subscribe); over HTTP below, the 2026 one (subscriptions/listen).
    async with Client(params, mode="legacy", message_handler=notices) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"ask", "read", "wait", "close", "list_sets", "upload_media", "verify"}
        asked = structured(await client.call_tool("ask", {"set": one_question(set_id)}))
        assert asked["created"] is True and asked["questions"] == ["branch"]
        refused = await client.call_tool("ask", {"set": {**one_question(set_id), "title": ""}})
        assert refused.is_error
        body = json.loads(refused.content[0].text)
        assert body["error"] == "lint_failed" and body["errors"][0]["where"] == "title"
        assert "Traceback" not in refused.content[0].text

        uri = f"askwright://sets/{set_id}/answers"
        await client.session.subscribe_resource(uri)
        await answer(bridge, set_id)
        steps: list[tuple[float, float | None, str | None]] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            steps.append((done, total, message))

        waited = structured(await client.call_tool("wait", {"set_id": set_id, "timeout": 30},
                                                   progress_callback=progress))
        assert waited["arrived"] is True
        entry = waited["answers"]["answers"][0]
        assert (entry["qid"], entry["state"], entry["choice"], entry["label"]) == \
            ("branch", "answered", "stable", "The stable branch")
        assert steps, "wait reported no progress"
        deadline = time.monotonic() + 10
        while uri not in updated:
            assert time.monotonic() < deadline, "no notice of the changed answers"
            await asyncio.sleep(0.1)
        listed = structured(await client.call_tool("list_sets", {}))
        assert [s["set"] for s in listed["sets"]] == [set_id]


async def test_mcp_over_streamable_http_with_a_subscription(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("remote")
    http = httpx2.AsyncClient(headers=auth("planner"), timeout=httpx2.Timeout(30, read=120))
    async with Client(streamable_http_client(base + "/mcp", http_client=http)) as client:
        asked = structured(await client.call_tool("ask", {"set": one_question(set_id)}))
        assert asked["created"] is True
        uri = f"askwright://sets/{set_id}/answers"
        before = json.loads((await client.read_resource(uri)).contents[0].text)
        assert before["count"] == 0 and before["answers"][0]["state"] == "unanswered"
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            answer_id = await answer(bridge, set_id, "main")

            async def first_event() -> Any:
                async for event in subscription:
                    return event

            event = await asyncio.wait_for(first_event(), 30)
            assert getattr(event, "uri", None) == uri
        waited = structured(await client.call_tool("wait", {"set_id": set_id, "timeout": 30}))
        assert waited["arrived"] is True
        assert waited["answers"]["answers"][0]["choice"] == "main"
        after = json.loads((await client.read_resource(uri)).contents[0].text)
        assert after["count"] == 1
        # Another agent's set is not there at all.
        other = httpx2.AsyncClient(headers=auth("other"), timeout=30)
        async with Client(streamable_http_client(base + "/mcp", http_client=other)) as stranger:
            result = await stranger.call_tool("read", {"set_id": set_id})
            assert result.is_error and json.loads(result.content[0].text)["error"] == "not_found"
    await bridge.alice.wait_notice(bridge.room_id, answer_id)
    async with aiohttp.ClientSession() as web:
        async with web.post(base + "/mcp", data=b"{}", headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401


async def test_http_api_and_webhooks_once_across_a_kill(bridge):
    receiver = Receiver(SECRETS["planner"])
    await receiver.start()
    receiver.status = 500  # not taken at first: the delivery stays in the outbox
    try:
        base = start(bridge, webhook_urls={"planner": receiver.url})
        await wait_listener(bridge, base)
        set_id = unique("hooks")
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
                assert response.status == 201
                assert (await response.json())["questions"] == ["branch"]
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
                assert response.status == 200
            answer_id = await answer(bridge, set_id)
            async with http.get(f"{base}/v1/sets/{set_id}/answers",
                                params={"wait": "answered", "timeout": "30"}) as response:
                assert response.status == 200 and response.headers["Askwright-Wait"] == "arrived"
                view = await response.json()
            assert view["answers"][0]["choice"] == "stable"
            async with http.get(f"{base}/v1/sets/{set_id}/answers", params={"all": "1"}) as response:
                assert (await response.json())["answers"][0]["qid"] == "branch"
        await receiver.wait_for(1, "attempts")
        bridge.kill()
        assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM webhook_outbox")[0][0] == 1
        receiver.status = 200
        bridge.start()
        taken = await receiver.wait_for(1)
        await asyncio.sleep(2)  # a second delivery, if there were one, would come now
        assert len([a for a in receiver.attempts if a["good"] and a["key"] == taken[0]["key"]]) >= 2
        assert receiver.ok == [taken[0]["key"]]  # delivered once, though tried before the kill
        body = taken[0]["body"]
        assert (body["type"], body["set"], body["qid"], body["answer_event_id"]) == \
            ("answer.accepted", set_id, "branch", answer_id)
        assert body["record"]["choice"] == "stable"
        # The webhook carries the receipt answers.json has for that answer (the answer log's leaf).
        assert body["receipt"] == bridge.answers(set_id)["answers"]["branch"]["receipt"]
        assert all(a["good"] for a in receiver.attempts)

        # Withdrawing the question: the room is told, and so is the agent.
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async with http.post(f"{base}/v1/sets/{set_id}/close",
                                 json={"status": "withdrawn", "reason": "Cut from the release"}) as response:
                assert response.status == 200
        closed = (await receiver.wait_for(2))[1]["body"]
        assert (closed["type"], closed["set"], closed["qid"]) == ("question.closed", set_id, "branch")
        assert closed["why"] == "withdrawn (Cut from the release)"
        assert store_rows(bridge.store_path, "SELECT COUNT(*) FROM webhook_outbox")[0][0] == 0
    finally:
        await receiver.close()


async def test_bad_input_gets_its_status_and_disturbs_nothing(bridge):
    receiver = Receiver(SECRETS["other"])
    silent = Silent()
    await receiver.start()
    await silent.start()
    try:
        base = start(bridge, webhook_urls={"other": receiver.url}, rate_per_minute=60)
        await wait_listener(bridge, base)
        mine, theirs = unique("mine"), unique("theirs")
        async with aiohttp.ClientSession() as http:
            put = f"{base}/v1/sets/{mine}"
            async with http.put(put, json={"set": one_question(mine), "callbacks": [silent.url]},
                                headers=auth("planner")) as response:
                assert response.status == 201
            async with http.put(f"{base}/v1/sets/{theirs}", json=one_question(theirs, "cut"),
                                headers=auth("other")) as r:
                assert r.status == 201
            bad = {**one_question(mine), "questions": [{**one_question(mine)["questions"][0], "question": "No mark"}]}
            async with http.put(put, json=bad, headers=auth("planner")) as response:
                assert response.status == 422
                found = await response.json()
                assert found["error"] == "lint_failed"
                assert any(e["where"].endswith(".question") for e in found["errors"])
            async with http.put(put, data=b"{not json", headers=auth("planner")) as response:
                assert response.status == 400
            async with http.put(put, data=b" " * (16 * 1024 * 1024 + 1), headers=auth("planner")) as response:
                assert response.status == 413
            async with http.get(f"{base}/v1/sets/{mine}/answers", headers={"Authorization": "Bearer nope"}) as r:
                assert r.status == 401
            async with http.get(f"{base}/v1/sets/{theirs}/answers", headers=auth("planner")) as response:
                assert response.status == 404
            async with http.put(f"{base}/v1/sets/{theirs}", json=one_question(theirs, "cut"),
                                headers=auth("planner")) as r:
                assert r.status == 404
            async with http.post(f"{base}/v1/sets/{theirs}/close", json={}, headers=auth("planner")) as response:
                assert response.status == 404
            # The set on disk is still the good one, and theirs still theirs.
            stored = json.loads((bridge.sets_root / mine / "questions.json").read_text())
            assert stored["questions"][0]["question"].endswith("?")

            # Both sets' answers come in; the silent callback delays nothing else.
            found = await bridge.wait_questions(bridge.alice, 2)
            for (_qid, _rev), event in found.items():
                await bridge.alice.send(bridge.room_id, answer_content(event, option_id="main"))
            taken = await receiver.wait_for(1)
            assert taken[0]["body"]["set"] == theirs
            async with http.get(f"{base}/v1/sets/{mine}/answers", params={"wait": "answered", "timeout": "20"},
                                headers=auth("planner")) as response:
                assert response.status == 200 and (await response.json())["count"] == 1

            # Closing: the question is closed in the room and answers to it refused.
            async with http.post(f"{base}/v1/sets/{mine}/close", json={"status": "withdrawn"},
                                 headers=auth("planner")) as response:
                assert response.status == 400  # withdrawn needs a reason
            async with http.post(f"{base}/v1/sets/{mine}/close", json={"status": "withdrawn", "reason": "Decided"},
                                 headers=auth("planner")) as response:
                assert response.status == 200
                assert (await response.json())["closed"] == ["branch"]
            deadline = time.monotonic() + 20
            while not any(e.get("content", {}).get("dev.superpipeline.question.closed")
                          for e in await bridge.alice.messages(bridge.room_id)):
                assert time.monotonic() < deadline, bridge.log_text()[-2000:]
                await asyncio.sleep(0.2)

            # Over the rate: 429, for this agent only.
            statuses = []
            for _ in range(70):
                async with http.get(f"{base}/v1/sets", headers=auth("planner")) as response:
                    statuses.append(response.status)
            assert 429 in statuses
            async with http.get(f"{base}/v1/sets", headers=auth("other")) as response:
                assert response.status == 200
        bridge.check_alive()
        assert "planner-token" not in bridge.log_text() and SECRETS["planner"] not in bridge.log_text()
    finally:
        await receiver.close()
        await silent.close()


async def test_schemathesis_with_every_check_finds_nothing(bridge):
    base = start(bridge, rate_per_minute=100000)
    await wait_listener(bridge, base)
    # The sets the document's examples name: one answered (so a long poll on
    # it returns at once), one for close to close (PUT's example is a third).
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        for set_id, qid in (("release-plan", "branch"), ("release-old", "cut")):
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id, qid)) as response:
                assert response.status == 201
    found = await bridge.wait_questions(bridge.alice, 2)
    await bridge.alice.send(bridge.room_id, answer_content(found[("branch", 1)], option_id="main"))
    await bridge.wait_answer("release-plan", "branch")
    # The long poll's waiting is tested elsewhere; here it answers at once, so
    # a set the run itself created is not waited on for a minute.  A set well
    # formed by the document's shapes can still fail lint, and a question id
    # well formed can be one the set does not have: 422 is the documented
    # answer to data of the right shape that the set can't take (rules no
    # JSON Schema can state), so the positive-data check takes it there; the
    # same for a range of the answer log past its size right now.
    (bridge.workdir / "schemathesis.toml").write_text(
        '[parameters]\n"query.timeout" = 0\n\n'
        '[[operations]]\ninclude-operation-id = ["putSet", "closeQuestions", "getAnswers", "logInclusion", '
        '"logConsistency", "logLeaves"]\n'
        '[operations.checks.positive_data_acceptance]\n'
        'expected-statuses = ["2xx", "401", "403", "404", "409", "422", "429"]\n')
    done = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "schemathesis.cli", "run", f"{base}/v1/openapi.json", "--url", base,
        "--header", f"Authorization: {auth('planner')['Authorization']}",
        "--checks", "all", "--phases", "examples,coverage,fuzzing,stateful",
        "--max-examples", "100", "--request-timeout", "20", "--seed", "18", "--no-color",
        "--generation-database", "none",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(bridge.workdir))
    output, _ = await asyncio.wait_for(done.communicate(), 240)
    text = output.decode(errors="replace")
    (bridge.workdir / "schemathesis.out").write_text(text)
    assert done.returncode == 0, text[-6000:]
    bridge.check_alive()
    assert "Traceback" not in bridge.log_text()


async def test_appservice_mode_serves_the_api_and_mcp_on_its_own_listener(appservice_synapse, tmp_path):
    """In appservice mode the agents' routes are on the listener the homeserver
    pushes to, beside the transactions, and an answer pushed there reaches the
    agent's long poll."""
    hs = appservice_synapse
    alice = Person(hs, hs.register(unique("alice")))
    bridge: Bridge | None = None
    try:
        room = hs.create_room(alice.token, invite=[AS_BOT])
        config = agents_config(free_port())
        config.pop("metrics")
        bridge = Bridge(synapse=hs, workdir=tmp_path, room_id=room, bot={"user_id": AS_BOT, "access_token": None},
                        extra_config={"appservice": dict(hs.appservice), **config})
        bridge.sets_root.mkdir()
        bridge.start()
        base = hs.appservice["url"]
        await wait_listener(bridge, base)
        set_id = unique("pushed")
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
                assert response.status == 201
            (question,) = (await bridge.wait_questions(alice, 1)).values()
            await alice.send(room, answer_content(question, option_id="main"))
            async with http.get(f"{base}/v1/sets/{set_id}/answers",
                                params={"wait": "answered", "timeout": "30"}) as response:
                assert response.headers["Askwright-Wait"] == "arrived"
                assert (await response.json())["answers"][0]["choice"] == "main"
        mcp_http = httpx2.AsyncClient(headers=auth("planner"), timeout=30)
        async with Client(streamable_http_client(base + "/mcp", http_client=mcp_http)) as client:
            listed = structured(await client.call_tool("list_sets", {}))
            assert listed["sets"] == [{"set": set_id, "rev": 1, "open": 1, "answered": 1}]
        bridge.check_alive()
    finally:
        if bridge is not None:
            bridge.kill()
        await alice.close()


async def test_a_wait_for_a_question_closed_meanwhile_ends_at_once_over_both_doors(bridge):
    """A long poll and an MCP wait for one question; the question is closed
    (the agent's other process, a moderator, a quorum deciding): both end
    at once saying so, where each held until its timeout and the agent
    waited again, for ever."""
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("closing")
    why = "question 'branch' is closed: it can get no answer now"
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
            assert response.status == 201

        async def long_poll() -> tuple[int, str | None, str | None, str]:
            async with http.get(f"{base}/v1/sets/{set_id}/answers",
                                params={"wait": "answered", "question": "branch", "timeout": "300",
                                        "all": "1"}) as response:
                view = await response.json()
                return (response.status, response.headers.get("Askwright-Wait"),
                        response.headers.get("Askwright-Wait-Reason"), view["answers"][0]["status"])

        poll = asyncio.ensure_future(long_poll())
        mcp_http = httpx2.AsyncClient(headers=auth("planner"), timeout=httpx2.Timeout(30, read=300))
        async with Client(streamable_http_client(base + "/mcp", http_client=mcp_http)) as client:
            await client.list_tools()  # the client checks results against the output schemas it listed
            waiting = asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "question": "branch",
                                                                      "timeout": 300, "all": True}))
            await asyncio.sleep(2)
            assert not poll.done() and not waiting.done()
            async with http.post(f"{base}/v1/sets/{set_id}/close", json={"questions": ["branch"]}) as response:
                assert response.status == 200, await response.text()
            closed = time.monotonic()
            assert await asyncio.wait_for(poll, 20) == (200, "unanswerable", why, "closed")
            waited = structured(await asyncio.wait_for(waiting, 20))
            assert time.monotonic() - closed < 10
            assert (waited["arrived"], waited["unanswerable"]) == (False, why)
            assert waited["answers"]["answers"][0]["status"] == "closed"
            # Asked again, it ends at once.
            began = time.monotonic()
            again = structured(await client.call_tool("wait", {"set_id": set_id, "question": "branch", "timeout": 300}))
            assert again["unanswerable"] == why and time.monotonic() - began < 5
    bridge.check_alive()


async def test_a_sigterm_ends_open_long_polls_and_mcp_sessions_promptly(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("stopping")
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id)) as response:
            assert response.status == 201

        async def long_poll() -> tuple[int, str | None]:
            async with http.get(f"{base}/v1/sets/{set_id}/answers",
                                params={"wait": "all", "timeout": "300"}) as response:
                await response.read()
                return response.status, response.headers.get("Askwright-Wait")

        poll = asyncio.ensure_future(long_poll())
        mcp_http = httpx2.AsyncClient(headers=auth("planner"), timeout=httpx2.Timeout(30, read=300))
        async with Client(streamable_http_client(base + "/mcp", http_client=mcp_http)) as client:
            await client.list_tools()  # the client checks results against the output schemas it listed
            waiting = asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "until": "all",
                                                                      "timeout": 300}))
            await asyncio.sleep(2)
            assert not poll.done() and not waiting.done()
            assert await asyncio.to_thread(bridge.stop, 20) == 0
            # Said as the stop, not as a timeout that never happened: the agent asks again.
            assert await asyncio.wait_for(poll, 10) == (200, "stopping")
            result = await asyncio.wait_for(waiting, 10)
            assert structured(result)["arrived"] is False and structured(result)["stopping"] is True
