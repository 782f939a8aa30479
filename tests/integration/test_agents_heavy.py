"""One agent's big set does not stop the bridge for the others, against the
real bridge: a questions.json near the format's 16 MB, tens of thousands of
questions, lints for seconds, and while it does ``/health`` and another
agent's calls are answered as usual."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time

import aiohttp
import pytest

from helpers.agents import agents_config, auth, free_port, one_question, start, wait_listener
from helpers.harness import answer_content, hooked, unique
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


# Loaded first by the bridge's interpreter: a big set's judging takes 3 s
# more, so what comes meanwhile surely comes meanwhile (on a fast machine
# the lint of 1,500 questions is over in less than the 0.3 s the others wait).
SLOW_BIG_LINT = '''
import time
from bridge.agents import sets

def slowly(fn, *args, _judged=sets.in_a_process):
    time.sleep(3)
    return _judged(fn, *args)

sets.in_a_process = slowly
'''


async def test_a_folder_made_while_a_set_lints_is_looked_at_again_not_refused(bridge, tmp_path):
    """The lint of a big set takes a while, and the folder can come
    meanwhile: the agent's own media upload claims it (the set is then
    written into it), or another agent's set makes it theirs (then it is
    another's set, 404 as ever, not a 400 saying one was made)."""
    bridge.env = hooked(tmp_path / "hook", SLOW_BIG_LINT)
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


def big_answered_set(set_id: str, count: int = 24_000) -> bytes:
    """A valid set of ``count`` questions (about 9 MB; 16 MB as the bridge writes it), all but the first
    closed already: nothing to post, all of it to read."""
    template = one_question(set_id)["questions"][0]
    questions = [{**template, "id": f"q{n}", "title": f"Release branch {n}",
                  "question": f"Which branch should release {n} be cut from?",
                  **({"status": "closed"} if n else {})} for n in range(count)]
    return json.dumps({**one_question(set_id), "questions": questions}).encode()


async def test_reads_and_waits_on_a_big_set_leave_health_and_other_agents_answered(bridge):
    """Reading a set of 24,000 questions takes seconds: on the event loop,
    each read held every room, /health and every agent, and every wait on
    the set read it again at each change (ten waits and one close: 20 s)."""
    base = start(bridge, rate_per_minute=100_000)
    await wait_listener(bridge, base)
    set_id = unique("big")
    async with aiohttp.ClientSession(headers=auth("planner"), timeout=aiohttp.ClientTimeout(total=300)) as http:
        async with http.put(f"{base}/v1/sets/{set_id}", data=big_answered_set(set_id),
                            headers={"Content-Type": "application/json"}) as response:
            assert response.status == 201, (await response.text())[:300]
        async with http.get(f"{base}/v1/sets", headers=auth("other")) as response:
            assert response.status == 200

        async def get(params: dict[str, str]) -> tuple[int, dict]:
            async with http.get(f"{base}/v1/sets/{set_id}/answers", params=params) as response:
                return response.status, await response.json()

        async def load() -> list[tuple[int, dict]]:
            waits = [asyncio.ensure_future(get({"wait": "all", "timeout": "200"})) for _ in range(10)]
            reads = await asyncio.gather(*(get({"all": "1"}) for _ in range(3)))
            await asyncio.sleep(2)  # the waits have read the set once
            async with http.post(f"{base}/v1/sets/{set_id}/close", json={"questions": ["q0"]}) as response:
                assert response.status == 200, await response.text()
            return [*reads, *await asyncio.gather(*waits)]

        busy = asyncio.ensure_future(load())
        health, others = await asyncio.gather(slowest_answer(http, f"{base}/health", "other", busy),
                                              slowest_answer(http, f"{base}/v1/sets", "other", busy))
        answered = await busy
    assert [status for status, _ in answered] == [200] * 13
    assert all(len(body["answers"]) == 24_000 for _status, body in answered[:3])
    assert health[1] >= 20 and others[1] >= 20, (health, others)
    # On the loop the waits held it 20 s.  Off it, the thirteen 24,000-answer
    # views are still serialized in threads that take the interpreter lock a
    # few tenths of a second at a time: the slowest answer beside them was
    # 0.8 to 1.5 s on 2 loaded cores, before this session's changes too.
    assert health[0] < 2.0 and others[0] < 2.0, (health, others)
    bridge.check_alive()


LOG_LEAVES = 100_000  # a busy bridge's answer log after some months


async def test_verify_over_a_long_answer_log_leaves_health_and_other_agents_answered(bridge):
    """MCP ``verify`` reads and hashes every leaf of the log (every agent's):
    on the event loop, one call over 100,000 leaves held the bridge 4 s."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    bridge.extra_config = {**agents_config(port, rate_per_minute=100_000), "audit": {"checkpoint_every": "1s"}}
    bridge.start()
    await wait_listener(bridge, base)
    mine = unique("logged")
    async with aiohttp.ClientSession(headers=auth("planner")) as http:
        async with http.put(f"{base}/v1/sets/{mine}", json=one_question(mine)) as response:
            assert response.status == 201
    (question,) = (await bridge.wait_questions(bridge.alice, 1)).values()
    await bridge.alice.send(bridge.room_id, answer_content(question, option_id="stable"))
    await bridge.wait_answer(mine, "branch")
    await asyncio.sleep(3)  # its checkpoint signed
    bridge.stop()
    # The log grown as months of other sets' answers grow it (copies of the
    # one leaf: what is measured is the reading and hashing, not the verdict).
    db = sqlite3.connect(bridge.store_path)
    (count, leaf), = db.execute("SELECT count(*), max(leaf) FROM audit_leaf").fetchall()
    digest = hashlib.sha256(b"\0" + leaf.encode()).hexdigest()
    db.executemany("INSERT INTO audit_leaf (idx, leaf, hash, seq) VALUES (?, ?, ?, NULL)",
                   ((n, leaf, digest) for n in range(count, count + LOG_LEAVES)))
    db.commit()
    db.close()
    bridge.start()
    await wait_listener(bridge, base)
    await asyncio.sleep(3)  # a checkpoint over the grown log
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http, \
            mcp_client(base, "2026-07-28") as client:
        busy = asyncio.ensure_future(asyncio.gather(*(client.call_tool("verify", {"set_id": mine})
                                                      for _ in range(3))))
        health, others = await asyncio.gather(slowest_answer(http, f"{base}/health", "other", busy),
                                              slowest_answer(http, f"{base}/v1/sets", "other", busy))
        results = await busy
    assert all(not result.is_error for result in results), results[0].content[0].text[:300]
    assert all(json.loads(r.content[0].text)["leaves"] >= LOG_LEAVES for r in results)
    assert health[1] >= 20 and others[1] >= 20, (health, others)
    assert health[0] < 1.5 and others[0] < 1.5, (health, others)
    bridge.check_alive()
