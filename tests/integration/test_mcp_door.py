"""/mcp as MCP's specification and its clients expect, against the real
Synapse and the bridge as its own process, with the SDK's own client in both
protocol eras: the handshake era (sessions) and 2026-07-28 (none).

A page elsewhere cannot reach /mcp by DNS rebinding; a 401 does not send a
client into OAuth; an unknown tool is a protocol error; a listen stream hears
only of the agent's own sets; ordinary use logs no error; and a kill -9 in
the middle of a wait costs the client one call, not the client."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from typing import Any

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from helpers.agents import TOKENS, auth, one_question, start, structured, wait_listener
from helpers.harness import answer_content, unique
from helpers.waiting import until

pytestmark = pytest.mark.integration

LEGACY = pytest.param("legacy", id="handshake-era",
                      marks=pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"))
MODERN = pytest.param("2026-07-28", id="2026-07-28")
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "a-test", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def mcp_client(base: str, mode: str, agent: str = "planner", **options: Any) -> Client:
    http = httpx2.AsyncClient(headers=auth(agent), timeout=httpx2.Timeout(30, read=300))
    return Client(streamable_http_client(base + "/mcp", http_client=http), mode=mode, **options)


def errors_in(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r" (ERROR|CRITICAL) |Traceback", line)]


async def post_initialize(base: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers}) as response:
            return response.status, response.headers


async def test_a_page_elsewhere_cannot_reach_mcp_by_dns_rebinding(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    own = base.removeprefix("http://")
    token = auth("planner")
    # What a rebinding page sends: its own name, as Host and as Origin.
    assert (await post_initialize(base, {**token, "Host": "evil.example.com",
                                         "Origin": "http://evil.example.com"}))[0] == 403
    assert (await post_initialize(base, {**token, "Origin": "http://evil.example.com"}))[0] == 403
    assert (await post_initialize(base, {**token, "Origin": "null"}))[0] == 403
    assert (await post_initialize(base, {**token, "Host": "evil.example.com"}))[0] == 421
    # A foreign origin is refused before the token is looked at.
    assert (await post_initialize(base, {"Origin": "http://evil.example.com"}))[0] == 403
    # Non-browser clients send no Origin; the bridge's own names and addresses are served.
    for headers in ({}, {"Origin": f"http://{own}"}, {"Host": own.replace("127.0.0.1", "localhost"),
                                                       "Origin": f"http://{own.replace('127.0.0.1', 'localhost')}"}):
        status, _ = await post_initialize(base, {**token, **headers})
        assert status == 200, headers
    assert "/mcp: requests from the origin 'http://evil.example.com' are not served here" in bridge.log_text()


async def test_a_401_at_mcp_does_not_send_a_client_into_oauth(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer not-the-token-0123456789"}):
            async with http.post(base + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **headers}) as response:
                assert response.status == 401
                assert "bearer" not in response.headers.get("WWW-Authenticate", "").lower()
                body = await response.json()
                assert body["error"]["message"] == "a valid bearer token is needed"
        # Nothing behind an OAuth flow either: no protected-resource metadata is served.
        async with http.get(base + "/.well-known/oauth-protected-resource/mcp") as response:
            assert response.status == 404
    # The SDK's client shows the bridge's own sentence.
    http = httpx2.AsyncClient(timeout=30)
    with pytest.raises(BaseException) as caught:
        async with Client(streamable_http_client(base + "/mcp", http_client=http), mode="legacy"):
            pass
    assert "a valid bearer token is needed" in repr(caught.value)


async def test_a_handshake_era_session_serves_only_the_agent_it_was_opened_by(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth("planner")}) as response:
            assert response.status == 200
            session = response.headers["Mcp-Session-Id"]
        for agent, status in (("other", 404), ("planner", 200)):
            headers = {**MCP_HEADERS, **auth(agent), "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
            async with http.post(base + "/mcp", json=listing, headers=headers) as response:
                assert response.status == status, agent
                body = await response.text()
        assert '"name":"ask"' in body.replace(" ", "")


async def test_a_session_its_client_ended_stays_ended_after_the_bridge_is_killed_and_started(bridge):
    """docs/agents.md: a session its client ended with DELETE stays ended.  A
    restarted bridge took it up again (the ended ids lived in memory only)."""
    base = start(bridge)
    await wait_listener(bridge, base)
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with aiohttp.ClientSession() as http:
        async with http.post(base + "/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **auth("planner")}) as response:
            session = response.headers["Mcp-Session-Id"]
        headers = {**MCP_HEADERS, **auth("planner"), "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        async with http.delete(base + "/mcp", headers=headers) as response:
            assert response.status in (200, 204)
        async with http.post(base + "/mcp", json=listing, headers=headers) as response:
            assert response.status == 404
        bridge.kill()
        bridge.start()
        await wait_listener(bridge, base)

        async def asked_again() -> int | None:
            async with http.post(base + "/mcp", json=listing, headers=headers) as response:
                return None if response.status == 503 else response.status  # 503: the MCP door still opening

        assert await until(asked_again, 30, "an answer from the restarted bridge's MCP door") == 404


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_an_unknown_tool_is_a_protocol_error_not_a_tool_result(bridge, mode):
    base = start(bridge)
    await wait_listener(bridge, base)
    async with mcp_client(base, mode) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("ask_everyone", {"set": one_question(unique("typo"))})
        assert caught.value.code == -32602
        assert "Unknown tool: ask_everyone" in caught.value.message
        # The client goes on: the error was the call's, not the connection's.
        assert {tool.name for tool in (await client.list_tools()).tools} >= {"ask", "wait"}
    assert not list(bridge.sets_root.glob("typo*"))


async def test_a_listen_stream_hears_only_of_the_agents_own_sets(bridge):
    base = start(bridge)
    await wait_listener(bridge, base)
    mine, theirs = unique("mine"), unique("theirs")
    async with mcp_client(base, "2026-07-28") as planner, mcp_client(base, "2026-07-28", agent="other") as other:
        structured(await planner.call_tool("ask", {"set": one_question(mine)}))
        structured(await other.call_tool("ask", {"set": one_question(theirs)}))
        for uris in ([f"askwright://sets/{mine}/answers"],
                     [f"askwright://sets/{theirs}/answers", f"askwright://sets/{mine}/answers"]):
            with pytest.raises(MCPError) as caught:
                async with other.listen(resource_subscriptions=uris):
                    pass
            # Refused exactly like a set that does not exist.
            assert caught.value.code == -32602
            assert caught.value.data == {"uri": f"askwright://sets/{mine}/answers"}
        async with other.listen(resource_subscriptions=[f"askwright://sets/{theirs}/answers"]) as own:
            assert [str(uri) for uri in own.honored.resource_subscriptions] == [f"askwright://sets/{theirs}/answers"]


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_ordinary_sdk_use_logs_no_error_and_a_client_giving_up_a_wait_stops_nothing(bridge, mode):
    base = start(bridge)
    await wait_listener(bridge, base)
    for _round in range(3):
        set_id = unique("daily")
        uri = f"askwright://sets/{set_id}/answers"
        async with mcp_client(base, mode) as client:
            await client.list_tools()
            structured(await client.call_tool("ask", {"set": one_question(set_id)}))
            assert json.loads((await client.read_resource(uri)).contents[0].text)["count"] == 0
            if mode == "legacy":
                await client.session.subscribe_resource(uri)
            else:
                async with client.listen(resource_subscriptions=[uri]):
                    await asyncio.sleep(0.3)
            # The agent gives up a wait (a timeout of its own, a user's Ctrl-C).
            waiting = asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "timeout": 120}))
            await asyncio.sleep(1.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            waited = structured(await client.call_tool("wait", {"set_id": set_id, "timeout": 0}))
            assert waited["arrived"] is False
            structured(await client.call_tool("close", {"set_id": set_id}))
    await asyncio.sleep(1)
    bridge.check_alive()
    async with mcp_client(base, mode) as client:
        listed = structured(await client.call_tool("list_sets", {}))
        assert len(listed["sets"]) == 3
        # An address that holds no set id is a resource that is not there, not the server's error.
        for uri in ("askwright://sets/a%2Fb/answers", "askwright://sets/%2E%2E/answers"):
            with pytest.raises(MCPError) as caught:
                await client.read_resource(uri)
            assert caught.value.code == (-32002 if mode == "legacy" else -32602) and "uri" in caught.value.data
    assert errors_in(bridge.log_text()) == []


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_kill_mid_wait_costs_the_client_one_call_and_the_answer_still_arrives(bridge, mode):
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("killed")
    async with mcp_client(base, mode) as client:
        structured(await client.call_tool("ask", {"set": one_question(set_id)}))
        (question,) = (await bridge.wait_questions(bridge.alice, 1)).values()
        waiting = asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "timeout": 300}))
        await asyncio.sleep(3)
        assert not waiting.done()
        bridge.kill()
        # The cut stream ends that one call with an error...
        with pytest.raises(MCPError):
            await asyncio.wait_for(waiting, 60)
        # ...Alice answers while the bridge is down...
        await bridge.alice.send(bridge.room_id, answer_content(question, option_id="stable"))
        bridge.start()
        await wait_listener(bridge, base)
        # ...and the same client object's next call is answered, with her answer.
        waited = structured(await client.call_tool("wait", {"set_id": set_id, "timeout": 60}))
        assert waited["arrived"] is True
        assert waited["answers"]["answers"][0]["choice"] == "stable"
        assert [s["set"] for s in structured(await client.call_tool("list_sets", {}))["sets"]] == [set_id]
    if mode == "legacy":
        assert "taken up again" in bridge.log_text().split("--- start 2 ---")[1]


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_wait_on_a_set_too_big_for_one_message_still_brings_the_answer(bridge, mode):
    """A set of 4,000 closed questions and one open: its whole view is 1.8 MB.
    A wait longer than a second is answered as one server-sent event, which
    the SDK's client reads up to 1 MiB: it raised, and the agent lost the
    answer it waited for.  The view keeps its answers within one message
    and names the resource that gives it whole."""
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("huge")
    document = one_question(set_id, qid="open")
    closed = document["questions"][0]
    document["questions"] += [{**closed, "id": f"old{n}", "title": f"Old question {n}", "status": "closed",
                               "question": f"Which branch did release {n} use?"} for n in range(4000)]
    async with mcp_client(base, mode) as client:
        structured(await client.call_tool("ask", {"set": document}))
        (question,) = (await bridge.wait_questions(bridge.alice, 1)).values()
        waiting = asyncio.ensure_future(client.call_tool("wait", {"set_id": set_id, "timeout": 120, "all": True}))
        await asyncio.sleep(2)
        await bridge.alice.send(bridge.room_id, answer_content(question, option_id="stable"))
        waited = structured(await asyncio.wait_for(waiting, 60))
        view = waited["answers"]
        assert waited["arrived"] is True and view["omitted"] > 0 and view["resource"].endswith(f"{set_id}/answers")
        assert [a["choice"] for a in view["answers"] if a["qid"] == "open"] == ["stable"]
        if mode != "legacy":  # (a handshake-era session answers every request as an event: docs/agents.md)
            whole = json.loads((await client.read_resource(view["resource"])).contents[0].text)
            assert len(whole["answers"]) == 4001


async def test_a_body_cut_off_midway_is_no_error_of_the_bridges(bridge):
    """A client (or its network) gone halfway through its body: each logged
    an ERROR with a traceback, at /mcp (both eras) and at the HTTP API alike."""
    base = start(bridge)
    await wait_listener(bridge, base)
    port = int(base.rsplit(":", 1)[1])
    token = auth("planner")["Authorization"]
    # (2026-07-28: no session, the SDK's other path reads the body.)
    for target, more in (("POST /mcp", ""), ("POST /mcp", "MCP-Protocol-Version: 2026-07-28\r\n"),
                         ("PUT /v1/sets/cut", "")):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {token}\r\n{more}"
                     "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                     "Content-Length: 100000\r\n\r\n".encode() + b'{"jsonrpc": "2.0", "id": 1, "met')
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.close()
    await asyncio.sleep(1.5)
    bridge.check_alive()
    assert errors_in(bridge.log_text()) == []
    # A body announced far past what /mcp takes is refused at once, not read for.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {token}\r\n"
                 "MCP-Protocol-Version: 2026-07-28\r\nContent-Type: application/json\r\n"
                 "Accept: application/json, text/event-stream\r\nContent-Length: 1000000000000\r\n\r\n".encode())
    await writer.drain()
    said = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert said.startswith(b"HTTP/1.1 413") and b"larger than" in said, said


async def test_a_body_whose_content_encoding_does_not_decode_is_the_clients_400(bridge):
    """A body labelled gzip that is not (a proxy adding the header, a
    client's broken compressor): each JSON route of the API answered a
    plain-text 500 ("Server got itself in trouble") and logged an ERROR with
    a traceback, /mcp did the same even for a request with a wrong token, and
    a media upload said its body was cut off."""
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("encoded")
    broken = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{base}/v1/sets/{set_id}", json=one_question(set_id), headers=auth("planner")) as r:
            assert r.status == 201
        for method, path in (("PUT", f"/v1/sets/{set_id}"), ("POST", f"/v1/sets/{set_id}/close"),
                             ("PUT", f"/v1/sets/{set_id}/media/take-2.png")):
            async with http.request(method, base + path, data=b'{"not": "gzip at all"}',
                                    headers={**auth("planner"), **broken}) as response:
                said = await response.json()
                assert response.status == 400, (path, said)
                assert said["error"] == "bad_request" and "Content-Encoding" in said["message"], said
                assert response.headers["Connection"] == "close"  # the rest of the body can't be read past
        for agent in ({"Authorization": "Bearer nope"}, auth("planner")):
            async with http.post(base + "/mcp", data=json.dumps(INITIALIZE).encode(),
                                 headers={**MCP_HEADERS, **agent, **broken}) as response:
                said = await response.json()
                assert response.status in (400, 401), said
                assert said["jsonrpc"] == "2.0" and "error" in said, said
    # Nothing of the set changed, nothing was stored, and nothing is the bridge's fault.
    stored = json.loads((bridge.sets_root / set_id / "questions.json").read_text())
    assert stored["questions"][0].get("status", "open") == "open"
    assert not (bridge.sets_root / set_id / "take-2.png").exists()
    await asyncio.sleep(0.5)
    bridge.check_alive()
    assert errors_in(bridge.log_text()) == []


WAITING_CLIENT = """
import asyncio, sys
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def main(base, token, set_id, mode):
    async def progress(done, total, message):
        print("waiting", flush=True)  # the bridge read the set and holds the wait from here

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=300))
    async with Client(streamable_http_client(base + "/mcp", http_client=http), mode=mode) as client:
        await client.call_tool("wait", {"set_id": set_id, "timeout": 250}, progress_callback=progress)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_client_killed_mid_wait_gives_its_wait_back_at_once(bridge, mode, tmp_path):
    """An agent's client crashes (or its machine loses the network) in a
    wait: its slot under agent_api.max_waits is free again within seconds,
    not held until the wait's timeout (250 s here) locking the agent out."""
    base = start(bridge, max_waits=2)
    await wait_listener(bridge, base)
    set_id = unique("vanished")
    async with mcp_client(base, mode) as client:
        structured(await client.call_tool("ask", {"set": one_question(set_id)}))
    script = tmp_path / "waiting_client.py"
    script.write_text(WAITING_CLIENT)
    said = tmp_path / "clients.log"
    with open(said, "wb") as out:
        clients = [subprocess.Popen([sys.executable, str(script), base, TOKENS["planner"], set_id, mode],
                                    stdout=out, stderr=subprocess.STDOUT) for _ in range(2)]
    url = f"{base}/v1/sets/{set_id}/answers"
    try:
        async with aiohttp.ClientSession(headers=auth("planner")) as http:
            async def a_wait() -> int:
                async with http.get(url, params={"wait": "answered", "timeout": "1"}) as response:
                    return response.status
            await until(lambda: said.read_text().count("waiting") == 2, timeout=60)
            await asyncio.sleep(1)
            assert await a_wait() == 429, said.read_text()  # both held: a third wait is over the cap
            for process in clients:
                process.kill()
                process.wait()
            began = time.monotonic()
            while await a_wait() == 429:
                assert time.monotonic() - began < 15, "the killed clients' waits still hold their slots"
                await asyncio.sleep(0.5)
    finally:
        for process in clients:
            process.kill()
    bridge.check_alive()


async def test_one_agent_holding_its_share_of_sessions_leaves_the_others_theirs(bridge):
    # The SDK's cap (10,000 sessions) was every agent's together: one token
    # holder opening sessions and never ending them got every other agent's
    # handshake-era client a bare 503 "Too many open sessions", nothing logged.
    base = start(bridge, rate_per_minute=100000)
    await wait_listener(bridge, base)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "hoarder", "version": "0"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as http:
        async def initialize(agent: str) -> aiohttp.ClientResponse:
            async with http.post(f"{base}/mcp", json=init, headers={**headers, **auth(agent)}) as response:
                await response.read()
                return response

        for response in await asyncio.gather(*[initialize("planner") for _ in range(1010)]):
            statuses[response.status] = statuses.get(response.status, 0) + 1
        assert statuses == {200: 1000, 429: 10}
        refused = await initialize("planner")
        assert refused.status == 429 and refused.headers["Retry-After"] == "60"
        assert (await refused.json())["error"]["data"]["error"] == "too_many_sessions"
        # The other agent's own client is served as ever.
        async with mcp_client(base, "legacy", agent="other") as client:
            await client.list_tools()
    assert "holds 1000 open sessions" in bridge.log_text()


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_refusal_quoting_a_megabyte_reaches_the_client_as_a_tool_error(bridge, mode):
    """A close naming a question id of 1.1 MB: the refusal quoted it whole
    ("no question 'xxx…'"), one event past the SDK's 1 MiB, and a handshake-era
    client's call failed ("Server-sent event exceeded the 1048576 byte limit")
    instead of telling it why.  So did a set whose findings named such ids."""
    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("echo")
    async with mcp_client(base, mode) as client:
        structured(await client.call_tool("ask", {"set": one_question(set_id)}))
        closed = await client.call_tool("close", {"set_id": set_id, "questions": ["x" * 1_100_000]})
        assert closed.is_error, closed
        refusal = json.loads(closed.content[0].text)
        assert refusal["error"] == "unprocessable" and refusal["message"].startswith("no question 'xxx")
        assert len(refusal["message"]) < 5000
        document = one_question(unique("ids"))
        first = document["questions"][0]
        document["questions"] = [{**first, "id": f"{n}{'y' * 12_000}"} for n in range(100)]
        refused = await client.call_tool("ask", {"set": document})
        assert refused.is_error and json.loads(refused.content[0].text)["error"] == "lint_failed"


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_32_mb_file_in_base64_lines_is_taken_by_upload_media(bridge, mode):
    """docs/agents.md: base64 "in lines or not", up to 32 MB.  Wrapped as
    MIME and the base64 command wrap it, each line's end costs two bytes in
    the call's JSON ("\\n"): a file from 31.2 MB up was refused at the door
    (a protocol error, "the body is larger than ...") before the tool saw it."""
    import base64
    import hashlib
    import os

    base = start(bridge)
    await wait_listener(bridge, base)
    set_id = unique("big")
    clip = os.urandom(32 * 1024 * 1024)
    async with mcp_client(base, mode) as client:
        structured(await client.call_tool("ask", {"set": one_question(set_id)}))
        stored = structured(await client.call_tool("upload_media", {
            "set_id": set_id, "name": "take.mp4", "data": base64.encodebytes(clip).decode().replace("\n", "\r\n")}))
    assert (stored["size"], stored["sha256"]) == (len(clip), hashlib.sha256(clip).hexdigest())
