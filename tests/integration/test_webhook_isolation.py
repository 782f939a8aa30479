"""Webhooks against the running bridge and a real Synapse: a URL that
accepts connections and never answers, with a hundred answers' webhooks
pending, delays no other agent's webhook; callbacks into the bridge's own
network are refused at ask (HTTP and MCP) unless the operator allows them;
/health and ``status`` show every background task the supervisor runs."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bridge.agents.addresses import parse, refusal
from bridge.agents.circuit import PER_URL
from helpers.agents import (SECRETS, TOKENS, Receiver, Silent, agents_config, auth, free_port, one_question,
                            wait_listener)
from helpers.harness import answer_content, store_rows, unique

pytestmark = pytest.mark.integration


async def put(http: aiohttp.ClientSession, base: str, agent: str, set_id: str, callbacks: list[str] | None = None,
              qid: str = "branch") -> tuple[int, dict]:
    body = one_question(set_id, qid) if callbacks is None else {"set": one_question(set_id, qid), "callbacks": callbacks}
    async with http.put(f"{base}/v1/sets/{set_id}", json=body, headers=auth(agent)) as response:
        return response.status, await response.json()


async def test_a_silent_url_with_a_hundred_pending_delays_no_other_agents_webhook(bridge):
    silent, receiver = Silent(), Receiver(SECRETS["other"])
    await silent.start()
    await receiver.start()
    port = free_port()
    # A long webhook_timeout: each delivery to the silent URL holds its connection for all of it.
    bridge.extra_config = agents_config(port, webhook_urls={"other": receiver.url}, webhook_timeout="30s")
    bridge.start()
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_listener(bridge, base)
        stuck, fine = unique("stuck"), unique("fine")
        async with aiohttp.ClientSession() as http:
            assert (await put(http, base, "planner", stuck, [silent.url]))[0] == 201
            found = await bridge.wait_questions(bridge.alice, 1)
            (question,) = found.values()
            # A hundred answers (a person changing their mind), each one webhook to the silent URL.
            for n in range(100):
                await bridge.alice.send(bridge.room_id, answer_content(question, option_id=("main", "stable")[n % 2]))
            deadline = time.monotonic() + 60

            def pending() -> int:
                return store_rows(bridge.store_path, "SELECT COUNT(*) FROM webhook_outbox WHERE url=?", silent.url)[0][0]
            while silent.connections < PER_URL or pending() < 100:
                assert time.monotonic() < deadline, f"{silent.connections} connections, {pending()} pending"
                await asyncio.sleep(0.05)
            assert (await put(http, base, "other", fine, qid="cut"))[0] == 201
            found = await bridge.wait_questions(bridge.alice, 2)
            theirs = next(event for event in found.values() if event["content"]["set"]["id"] == fine)
            answers = bridge.sets_root / fine / "answers.json"
            await bridge.alice.send(bridge.room_id, answer_content(theirs, option_id="main"))
            while not answers.exists():  # the bridge has accepted it (its webhook row is committed by now)
                assert time.monotonic() < deadline + 60, bridge.log_text()[-3000:]
                await asyncio.sleep(0.01)
            accepted = time.monotonic()
            (taken,) = await receiver.wait_for(1, timeout=60)
            took = time.monotonic() - accepted
            assert took < 1.0, f"the other agent's webhook came {took:.1f} s after its answer was accepted"
            assert (taken["body"]["set"], taken["body"]["qid"], taken["good"]) == (fine, "cut", True)
            assert silent.connections <= PER_URL  # the silent URL holds no more than its own lane
            assert pending() == 100  # all still waiting on it
        bridge.check_alive()
    finally:
        await receiver.close()
        await silent.close()


def _inward_name() -> str:
    """This machine's own name: it resolves to one of its own addresses (loopback or private)."""
    name = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    assert addresses and all(refusal(parse(a)) for a in addresses), f"{name} resolves to {addresses}"
    return name


async def test_callbacks_into_the_bridges_network_are_refused_at_ask_and_tasks_are_shown(bridge):
    port = free_port()
    bridge.extra_config = agents_config(port, allow_private_callbacks=False)
    bridge.start()
    base = f"http://127.0.0.1:{port}"
    inward = ["http://127.0.0.1:8080/hook", "http://10.1.2.3/hook", "http://169.254.169.254/latest/meta-data/",
              "http://[::1]/hook", "http://[::ffff:127.0.0.1]/hook", "http://localhost:9000/hook",
              f"http://{_inward_name()}:9000/hook"]
    await wait_listener(bridge, base)
    async with aiohttp.ClientSession() as http:
        for url in inward:
            set_id = unique("inward")
            status, body = await put(http, base, "planner", set_id, ["https://hooks.example.org/fine", url])
            assert status == 422, (url, body)
            assert body["error"] == "callback_refused" and [e["where"] for e in body["errors"]] == ["callbacks[1]"]
            assert not (bridge.sets_root / set_id).exists()  # nothing written
        async with http.get(base + "/health") as response:
            tasks = (await response.json())["tasks"]

    # MCP's ask refuses the same, as a tool error naming the field.
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKENS['planner']}"}, timeout=30)
    async with Client(streamable_http_client(base + "/mcp", http_client=client)) as mcp:
        set_id = unique("mcp-inward")
        result = await mcp.call_tool("ask", {"set": one_question(set_id), "callbacks": ["http://169.254.169.254/"]})
        assert result.is_error
        error = json.loads(result.content[0].text)
        assert error["error"] == "callback_refused" and error["errors"][0]["where"] == "callbacks[0]"
        assert "metadata" in error["message"]
        assert not (bridge.sets_root / set_id).exists()

    # Every long-lived task runs under the supervisor, and /health and status say so.
    for name in ("transport", "notices", "sets", "commands", "mcp", "answers-watch", "webhooks"):
        assert tasks[name]["state"] == "running" and tasks[name]["restarts"] == 0, (name, tasks)
    shown = subprocess.run([sys.executable, "-m", "bridge", "status", "-c", str(bridge.config_path)],
                           capture_output=True, text=True, cwd=bridge.workdir, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "task webhooks: running" in shown.stdout and "task transport: running" in shown.stdout
    bridge.check_alive()


async def test_a_webhook_url_going_inward_stops_the_start_with_the_key_named(bridge):
    port = free_port()
    config = agents_config(port, webhook_urls={"planner": f"http://{_inward_name()}:9000/hook"},
                           allow_private_callbacks=False)
    bridge.extra_config = config
    bridge.start()
    deadline = time.monotonic() + 60
    while bridge.process.poll() is None:
        assert time.monotonic() < deadline, "the bridge started with a webhook_url into its own network"
        await asyncio.sleep(0.2)
    assert bridge.process.returncode != 0
    log = bridge.log_text()
    assert "agents.planner.webhook_url" in log and "allow_private_callbacks" in log


async def test_a_2xx_whose_body_comes_slowly_is_taken_once(bridge):
    """'Any 2xx takes it', however slowly the rest of the answer comes: the
    status is read, the body given up at the timeout, and the event is not
    sent again (it was, at every backoff, for a day)."""
    keys: list[str] = []

    async def answer_200_then_dawdle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower().split("\r\n")
        fields = dict(line.split(":", 1) for line in head[1:] if ":" in line)
        keys.append(fields["idempotency-key"].strip())
        await reader.readexactly(int(fields["content-length"]))
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n2\r\nok\r\n")
        await writer.drain()
        await asyncio.sleep(4)  # the last chunk after the bridge's 2 s timeout
        writer.write(b"0\r\n\r\n")
        writer.close()

    hook_port = free_port()
    server = await asyncio.start_server(answer_200_then_dawdle, "127.0.0.1", hook_port)
    port = free_port()
    bridge.extra_config = agents_config(port, webhook_urls={"planner": f"http://127.0.0.1:{hook_port}/hook"},
                                        webhook_timeout="2s")
    bridge.start()
    base = f"http://127.0.0.1:{port}"
    set_id = unique("slowbody")
    try:
        await wait_listener(bridge, base)
        async with aiohttp.ClientSession() as http:
            assert (await put(http, base, "planner", set_id))[0] == 201
        (question,) = (await bridge.wait_questions(bridge.alice, 1)).values()
        await bridge.alice.send(bridge.room_id, answer_content(question, option_id="main"))
        deadline = time.monotonic() + 30
        while not keys or store_rows(bridge.store_path, "SELECT id FROM webhook_outbox"):
            assert time.monotonic() < deadline, ("the 200 was not taken", keys)
            await asyncio.sleep(0.2)
        await asyncio.sleep(5)  # a retry would come 1 s after the first try's timeout
    finally:
        server.close()
    assert len(keys) == 1, keys
    assert "not taken" not in bridge.log_text()
