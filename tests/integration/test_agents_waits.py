"""Agents' waits against the real bridge and Synapse: many at once, each
answered by a real person's answer, under the caps; ``after``; the rate
budget left alone by waiting; and malformed requests refused by the
OpenAPI document with the field named, touching nothing."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from helpers.agents import auth, one_question, start, wait_listener
from helpers.harness import answer_content, unique

pytestmark = pytest.mark.integration

SETS = 3
WAITS_PER_SET = 50  # 150 at once: the old inotify watcher per wait ran out at 128


async def held(http: aiohttp.ClientSession, url: str, params: dict[str, str]) -> tuple[int, str | None, Any]:
    async with http.get(url, params=params) as response:
        body = await response.json()
        return response.status, response.headers.get("Askwright-Wait"), body


async def test_150_concurrent_waits_each_get_the_answer_under_the_caps_without_spending_the_budget(bridge):
    # A budget of 20 requests a minute: 150 waits would have spent it seven times over.
    base = start(bridge, max_waits=SETS * WAITS_PER_SET + 5, rate_per_minute=20)
    await wait_listener(bridge, base)
    ids = [unique(f"many{n}") for n in range(SETS)]
    options = ["main", "stable", "main"]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=auth("planner"), connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=240)) as http:
        for n, set_id in enumerate(ids):  # one question id per set: the room tells them apart by it
            async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id, f"q{n}")) as response:
                assert response.status == 201, await response.text()
        waits = [asyncio.ensure_future(held(http, f"{base}/v1/sets/{set_id}/answers",
                                            {"wait": "answered", "timeout": "180"}))
                 for set_id in ids for _ in range(WAITS_PER_SET)]
        extra = [asyncio.ensure_future(held(http, f"{base}/v1/sets/{ids[0]}/answers",
                                            {"wait": "all", "timeout": "180"})) for _ in range(5)]
        await asyncio.sleep(3)
        assert not any(w.done() for w in waits + extra), [w.result() for w in waits + extra if w.done()][:3]

        # At the cap: one more is 429 with Retry-After, and a request that is not a wait still goes through.
        async with http.get(f"{base}/v1/sets/{ids[0]}/answers", params={"wait": "answered", "timeout": "60"}) as r:
            assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
            assert (await r.json())["error"] == "too_many_waits"
        async with http.get(f"{base}/v1/sets") as response:
            assert response.status == 200
        # Another agent's waits are its own.
        async with aiohttp.ClientSession(headers=auth("other")) as other:
            async with other.get(f"{base}/v1/sets") as response:
                assert response.status == 200

        found = await bridge.wait_questions(bridge.alice, SETS)
        by_set = {event["content"]["set"]["id"]: event for event in found.values()}
        for set_id, option in zip(ids, options):
            await bridge.alice.send(bridge.room_id, answer_content(by_set[set_id], option_id=option))
        results = await asyncio.wait_for(asyncio.gather(*waits, *extra), 120)
        for n, (status, state, body) in enumerate(results[:len(waits)]):
            set_id, option = ids[n // WAITS_PER_SET], options[n // WAITS_PER_SET]
            assert (status, state, body["set"]) == (200, "arrived", set_id)
            assert [(e["qid"], e["choice"]) for e in body["answers"]] == [(f"q{n // WAITS_PER_SET}", option)]
        assert all(r[:2] == (200, "arrived") for r in results[len(waits):])

        # The waits are over: there is room again.
        status, state, body = await held(http, f"{base}/v1/sets/{ids[1]}/answers", {"wait": "answered",
                                                                                  "timeout": "5"})
        assert (status, state) == (200, "arrived")
        seen = body["answers"][0]["updated"]

        # after: the answer already seen does not count; the next one does.
        later = asyncio.ensure_future(held(http, f"{base}/v1/sets/{ids[1]}/answers",
                                           {"wait": "answered", "after": seen, "timeout": "120"}))
        status, state, _ = await held(http, f"{base}/v1/sets/{ids[1]}/answers",
                                      {"wait": "answered", "after": seen, "timeout": "2"})
        assert (status, state) == (200, "timeout")
        assert not later.done()
        await bridge.alice.send(bridge.room_id, answer_content(by_set[ids[1]], option_id="main"))
        status, state, body = await asyncio.wait_for(later, 60)
        assert (status, state) == (200, "arrived")
        assert body["answers"][0]["choice"] == "main" and body["answers"][0]["updated"] > seen
    bridge.check_alive()
    assert "Too many open files" not in bridge.log_text()


async def test_malformed_requests_are_refused_by_the_document_naming_the_field_and_touch_nothing(bridge):
    base = start(bridge, max_waits=2)
    await wait_listener(bridge, base)
    set_id = unique("typo")
    two = one_question(set_id)
    two["questions"].append({**two["questions"][0], "id": "memo", "title": "Memo",
                             "question": "Which branch should the release memo name?"})
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.put(f"{base}/v1/sets/{set_id}", json=two) as response:
            assert response.status == 201
        close = f"{base}/v1/sets/{set_id}/close"
        for body, where in (({"question": ["memo"]}, "body.question"),
                            ({"questions": "memo"}, "body.questions"),
                            ({"questions": ["memo"], "status": "withdrawn", "reason": None}, "body.reason"),
                            ({"status": "withdrawn"}, "body.reason"),
                            ({"status": "gone"}, "body.status")):
            async with http.post(close, json=body) as response:
                found = await response.json()
                assert response.status == 400, (body, found)
                assert found["errors"][0]["where"] == where and found["message"].startswith(where), found
        async with http.post(close, data=b"[1, 2", headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400 and (await response.json())["errors"][0]["where"] == "body"
        stored = json.loads((bridge.sets_root / set_id / "questions.json").read_text())
        assert [q.get("status", "open") for q in stored["questions"]] == ["open", "open"]
        async with http.get(f"{base}/v1/sets/{set_id}/answers", params={"all": "1"}) as response:
            assert [e["status"] for e in (await response.json())["answers"]] == ["open", "open"]

        answers = f"{base}/v1/sets/{set_id}/answers"
        for params, where in (({"wait": "answered", "timeout": "301"}, "query.timeout"),
                              ({"wait": "answered", "timeout": "soon"}, "query.timeout"),
                              ({"wait": "later"}, "query.wait"),
                              ({"wait": "answered", "after": "yesterday"}, "query.after"),
                              ({"wiat": "answered"}, "query.wiat"),
                              ({"all": "yes"}, "query.all")):
            async with http.get(answers, params=params) as response:
                found = await response.json()
                assert response.status == 400 and found["errors"][0]["where"] == where, (params, found)
        # One id rule for every route: an id that can't be a set's is 400, naming it.
        for method, url in (("PUT", f"{base}/v1/sets/bad!id"), ("GET", f"{base}/v1/sets/bad!id/answers"),
                            ("POST", f"{base}/v1/sets/bad!id/close")):
            async with http.request(method, url, json=one_question("bad!id")) as response:
                found = await response.json()
                assert response.status == 400 and found["errors"][0]["where"] == "id", (method, found)
        async with http.get(f"{base}/v1/sets/no-such-set/answers") as response:
            assert response.status == 404
        async with http.head(f"{base}/v1/sets/{set_id}/answers", params={"all": "1"}) as response:
            assert response.status == 200  # HEAD is GET without the body
        async with http.head(f"{base}/v1/sets/{set_id}/answers", params={"all": "yes"}) as response:
            assert response.status == 400

    # Waits whose clients left give their places back: with max_waits 2, two
    # abandoned long polls do not keep a third out for long.
    leaving = aiohttp.ClientSession(headers=auth("planner"))
    gone = [asyncio.ensure_future(leaving.get(f"{base}/v1/sets/{set_id}/answers",
                                              params={"wait": "answered", "timeout": "300"})) for _ in range(2)]
    await asyncio.sleep(1)
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.get(f"{base}/v1/sets/{set_id}/answers", params={"wait": "answered", "timeout": "1"}) as r:
            assert r.status == 429  # both places are taken
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        await leaving.close()
        deadline = time.monotonic() + 20
        while True:
            async with http.get(f"{base}/v1/sets/{set_id}/answers",
                                params={"wait": "answered", "timeout": "1"}) as r:
                if r.status == 200:
                    assert r.headers["Askwright-Wait"] == "timeout"
                    break
                assert r.status == 429 and time.monotonic() < deadline, "abandoned waits kept their places"
            await asyncio.sleep(0.5)

    # MCP: the same timeout rule (refused over 300, not capped), the same id rule, reason null refused.
    mcp_http = httpx2.AsyncClient(headers=auth("planner"), timeout=30)
    async with Client(streamable_http_client(base + "/mcp", http_client=mcp_http)) as client:
        for name, arguments, words in (
                ("wait", {"set_id": set_id, "timeout": 301}, "timeout"),
                ("wait", {"set_id": "bad!id"}, "set_id"),
                ("wait", {"set_id": set_id, "after": "yesterday"}, "after"),
                ("close", {"set_id": set_id, "status": "withdrawn", "reason": None}, "reason"),
                ("close", {"set_id": set_id, "question": ["memo"]}, "question")):
            result = await client.call_tool(name, arguments)
            assert result.is_error, (name, arguments)
            error = json.loads(result.content[0].text)
            assert error["error"] == "bad_request" and words in error["message"], error
        # The cap is a tool error over MCP, as 429 is over HTTP.
        holding = [asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "timeout": 30}))
                   for _ in range(2)]
        await asyncio.sleep(1.5)
        over = await client.call_tool("wait", {"set_id": set_id, "timeout": 30})
        assert over.is_error and json.loads(over.content[0].text)["error"] == "too_many_waits"
        for task in holding:
            task.cancel()
        await asyncio.gather(*holding, return_exceptions=True)
    stored = json.loads((bridge.sets_root / set_id / "questions.json").read_text())
    assert [q.get("status", "open") for q in stored["questions"]] == ["open", "open"]

    # A request that is not HTTP at all: 400, and no ERROR or traceback in the log.
    port = int(base.rsplit(":", 1)[1])
    for garbage in (b"GET /v1/sets HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n",
                    b"GET /v1/sets HTTP/1.1\r\nBad Header: x\r\n\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        await writer.drain()
        assert (await reader.read(64)).split(b" ")[1] == b"400"
        writer.close()
    await asyncio.sleep(0.5)
    bridge.check_alive()
    log = bridge.log_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
