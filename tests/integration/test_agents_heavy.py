"""One agent's big set does not stop the bridge for the others, against the
real bridge: a questions.json near the format's 16 MB, tens of thousands of
questions, lints for seconds, and while it does ``/health`` and another
agent's calls are answered as usual."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from helpers.agents import auth, one_question, start, wait_listener
from helpers.harness import unique
from test_mcp_door import mcp_client

pytestmark = pytest.mark.integration

QUESTIONS = 40_000  # about 15 MB of JSON (the format allows 16 MiB): seconds of linting


def huge_set(set_id: str) -> bytes:
    template = one_question(set_id)["questions"][0]
    questions = [{**template, "id": f"q{n}", "title": f"Release branch {n}"} for n in range(QUESTIONS)]
    questions[-1]["id"] = "q0"  # one id twice: refused, once every question is linted
    return json.dumps({**one_question(set_id), "questions": questions}).encode()


async def slowest_answer(http: aiohttp.ClientSession, url: str, agent: str, busy: asyncio.Future) -> tuple[float, int]:
    """The longest any request to ``url`` took while ``busy`` ran, and how many were made."""
    slowest, made = 0.0, 0
    while not busy.done():
        began = time.monotonic()
        async with http.get(url, headers=auth(agent)) as response:
            assert response.status == 200, await response.text()
            await response.read()
        slowest, made = max(slowest, time.monotonic() - began), made + 1
        await asyncio.sleep(0.02)
    return slowest, made


async def put_over_http(base: str, http: aiohttp.ClientSession, body: bytes) -> tuple[int, str]:
    async with http.put(f"{base}/v1/sets/{json.loads(body)['id']}", data=body,
                        headers={**auth("planner"), "Content-Type": "application/json"}) as response:
        return response.status, await response.text()


async def ask_over_mcp(base: str, _http: aiohttp.ClientSession, body: bytes) -> tuple[int, str]:
    async with mcp_client(base, "2026-07-28") as client:
        result = await client.call_tool("ask", {"set": json.loads(body)})
    return (422 if result.is_error else 200), result.content[0].text


# The longest a look may wait meanwhile.  Over MCP the SDK itself parses
# and validates the request (15 MB of JSON-RPC) on the event loop, and the
# set crosses to its process by pickle: tenths of a second more.
@pytest.mark.parametrize(("door", "longest"), [(put_over_http, 1.5), (ask_over_mcp, 3.0)], ids=["http", "mcp"])
async def test_a_huge_set_being_linted_leaves_health_and_other_agents_answered(bridge, door, longest):
    base = start(bridge, rate_per_minute=100_000)  # the looks every 20 ms are not what is measured
    await wait_listener(bridge, base)
    body = huge_set(unique("huge"))
    assert 14_000_000 < len(body) < 16 * 1024 * 1024
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        async with http.get(f"{base}/v1/sets", headers=auth("other")) as response:
            assert response.status == 200  # warm: the first request loads the routes' code
        asked = asyncio.ensure_future(door(base, http, body))
        health, others = await asyncio.gather(slowest_answer(http, f"{base}/health", "other", asked),
                                              slowest_answer(http, f"{base}/v1/sets", "other", asked))
        status, said = await asked
    assert status == 422 and "q0" in said, said[:500]
    # The lint took seconds (many looks meanwhile); not one look waited for it.
    assert health[1] >= 20 and others[1] >= 20, (health, others)
    assert health[0] < longest and others[0] < longest, (health, others)
    bridge.check_alive()


async def held_body(base: str, path: str, first: bytes, trickle: float | None = None,
                    method: str = "PUT", content_type: str = "application/octet-stream") -> tuple[float, bytes]:
    """A request whose body stops after ``first`` (or goes on a byte every
    ``trickle`` seconds): how long until the bridge is done with it (its
    connection closed), and all it said."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    began = time.monotonic()
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth('planner')['Authorization']}\r\n"
                 f"Accept: application/json, text/event-stream\r\nContent-Type: {content_type}\r\n"
                 "Content-Length: 5000000\r\n\r\n".encode() + first)
    await writer.drain()

    async def dribble() -> None:
        while trickle is not None:
            await asyncio.sleep(trickle)
            writer.write(b"x")
            await writer.drain()

    dribbling = asyncio.ensure_future(dribble())
    try:
        said = await asyncio.wait_for(reader.read(), 60)  # to the end: the bridge closed the connection
        return time.monotonic() - began, said
    finally:
        dribbling.cancel()
        writer.close()


async def test_a_body_that_stops_coming_or_trickles_is_cut_off_not_held(bridge):
    """Headers and a few bytes of body, then nothing (or a byte now and
    then): each such request held a connection, and a descriptor, for ever."""
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("slow")
    async with aiohttp.ClientSession() as http:  # the set, for the media upload to go into
        async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id), headers=auth("planner")) as r:
            assert r.status == 201, await r.text()
    cut = await asyncio.gather(held_body(base, f"/v1/sets/{unique('stalled')}", b'{"ask'),
                               held_body(base, f"/v1/sets/{set_id}/media/take.png", b"\x89PNG"),
                               held_body(base, f"/v1/sets/{unique('trickled')}", b"{", trickle=4),
                               held_body(base, "/mcp", b'{"jsonrpc"', method="POST", content_type="application/json"))
    for took, said in cut[:3]:
        assert said.startswith(b"HTTP/1.1 408") and b"too_slow" in said, said
    for took, said in cut:  # within the 20 s it may stop for, or the average it must keep after 20 s
        assert took < 45, (took, said)
    bridge.check_alive()


async def test_a_folder_made_while_a_set_lints_is_looked_at_again_not_refused(bridge):
    """The lint of a big set takes a while, and the folder can come
    meanwhile: the agent's own media upload claims it (the set is then
    written into it), or another agent's set makes it theirs (then it is
    another's set, 404 as ever, not a 400 saying one was made)."""
    base = start(bridge, rate_per_minute=100_000)
    await wait_listener(bridge, base)
    mine, contested = unique("mine"), unique("contested")
    headers = {**auth("planner"), "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        async def put(set_id: str, body: bytes, agent_headers: dict[str, str]) -> tuple[int, str]:
            async with http.put(f"{base}/v1/sets/{set_id}", data=body, headers=agent_headers) as response:
                return response.status, await response.text()

        async def upload() -> int:
            await asyncio.sleep(0.3)
            async with http.put(f"{base}/v1/sets/{mine}/media/shot.png", data=b"\x89PNG\r\n\x1a\n" + b"\0" * 64,
                                headers=auth("planner")) as response:
                return response.status

        async def theirs() -> tuple[int, str]:
            await asyncio.sleep(0.3)
            return await put(contested, json.dumps(one_question(contested)).encode(),
                             {**auth("other"), "Content-Type": "application/json"})

        big = json.loads(huge_set(mine))  # 1,500 distinct questions: valid, and linted apart
        big["questions"] = [{**q, "question": f"Which branch should release {n} be cut from?"}
                            for n, q in enumerate(big["questions"][:1500])]
        (set_status, said), upload_status = await asyncio.gather(put(mine, json.dumps(big).encode(), headers),
                                                                 upload())
        assert (set_status, upload_status) == (201, 201), said[:300]
        contested_big = {**big, "id": contested}
        (mine_status, said), (their_status, _) = await asyncio.gather(
            put(contested, json.dumps(contested_big).encode(), headers), theirs())
        assert their_status == 201 and mine_status == 404, said[:300]
    bridge.check_alive()
