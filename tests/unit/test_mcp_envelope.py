"""What is POSTed to /mcp that is no JSON-RPC request, notification or
response gets JSON-RPC's Invalid Request (-32600) with HTTP 400, in the
handshake era too: an id of null, a fraction or true was answered 202 as if
a notification (the client waited for good), and a batch or an object with
no method -32602 with a dump of the SDK's model errors.  A key named twice
is refused, as /v1 refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_mcp_stopping import HEADERS, INITIALIZE, front_at


async def _session(http) -> dict[str, str]:
    async with http.post("/mcp", json=INITIALIZE, headers=HEADERS) as response:
        assert response.status == 200
        session = response.headers["Mcp-Session-Id"]
    headers = {**HEADERS, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    async with http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers=headers) as response:
        assert response.status == 202
    return headers


BAD = [
    ('{"jsonrpc": "2.0", "id": null, "method": "tools/list"}', None, "an id is a string or an integer"),
    ('{"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}', None, "an id is a string or an integer"),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/list"}', None, "an id is a string or an integer"),
    ('[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', None, "a batch (a JSON array) is not taken"),
    ('{"jsonrpc": "2.0", "id": 7}', 7, "a message has a method"),
    ('{"jsonrpc": "1.0", "id": 7, "method": "tools/list"}', 7, '"jsonrpc": "2.0"'),
    ('{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "list_sets", "name": "ask"}}', None,
     "'name'"),
]


@pytest.mark.parametrize("body,answered_id,words", BAD, ids=["null-id", "fraction-id", "true-id", "batch",
                                                             "no-method", "jsonrpc-1.0", "key-twice"])
async def test_what_is_no_json_rpc_message_is_an_invalid_request_with_400(tmp_path: Path, body, answered_id, words):
    async with front_at(tmp_path) as (http, _stop):
        headers = await _session(http)
        async with http.post("/mcp", data=body.encode(), headers=headers) as response:
            status, answer = response.status, json.loads(await response.read())
    assert status == 400, (status, answer)
    assert answer["id"] == answered_id and answer["error"]["code"] == -32600, answer
    assert words in answer["error"]["message"], answer


async def test_a_good_request_and_a_response_pass_as_before(tmp_path: Path):
    async with front_at(tmp_path) as (http, _stop):
        headers = await _session(http)
        async with http.post("/mcp", json={"jsonrpc": "2.0", "id": "a", "method": "ping"}, headers=headers) as response:
            assert response.status == 200
            assert '"id":"a"' in (await response.text()).replace(" ", "")
        # A client's answer to a request of the server's: a response, taken with 202.
        async with http.post("/mcp", json={"jsonrpc": "2.0", "id": 99, "result": {}}, headers=headers) as response:
            assert response.status == 202, await response.text()


SETS = 250


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"], ids=["handshake-era", "2026-07-28"])
async def test_resources_are_listed_in_pages_the_sdks_client_follows_to_the_end(tmp_path: Path, mode):
    """Every set's answers and files in one message passed, at a few thousand
    sets, the 1 MiB a client reads of one message: the agent could list
    nothing.  Pages of 100 sets, each named once, and a cursor this bridge
    never gave refused as invalid params."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    from helpers.agents import one_question

    def many(sets) -> None:
        for n in range(SETS):
            sets.ask("planner", f"s{n:03}", one_question(f"s{n:03}"))

    async with front_at(tmp_path, many) as (http, _stop):
        http_client = httpx2.AsyncClient(headers={"Authorization": HEADERS["Authorization"]},
                                         timeout=httpx2.Timeout(30))
        async with Client(streamable_http_client(str(http._base_url.with_path("/mcp")), http_client=http_client),
                          mode=mode) as client:
            seen, pages, cursor = [], 0, None
            while True:
                listed = await client.list_resources(cursor=cursor)
                seen += [str(r.uri) for r in listed.resources]
                pages += 1
                cursor = listed.next_cursor
                if cursor is None:
                    break
            with pytest.raises(MCPError) as refused:
                await client.list_resources(cursor="not a cursor!")
    assert pages == 3 and len(seen) == len(set(seen)) == SETS
    assert sorted(seen) == [f"askwright://sets/s{n:03}/answers" for n in range(SETS)]
    assert refused.value.error.code == -32602 and "not given by this bridge" in refused.value.error.message
