"""A person's file read over MCP (the blob resource): one past the 32 MiB a
resource read carries is refused naming the HTTP route, without being read;
one under it comes whole; the read and its base64 are done off the event
loop, a few at a time."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from bridge.agents import mcp_files
from bridge.agents.errors import TooLarge
from bridge.agents.mcp_files import MCP_MEDIA_MAX, McpFiles, attachment_uri
from bridge.agents.readgate import READS_AT_ONCE, READS_PER_AGENT


class Sets:
    """An agent's sets as the file reads see them: each set's answers name the files in its attachments/."""

    def __init__(self, root: Path):
        self.root = root

    def set_dir(self, agent: str, set_id: str) -> Path:
        return self.root / agent / set_id

    async def read_all_apart(self, agent: str, set_id: str) -> dict[str, Any]:
        folder = self.set_dir(agent, set_id) / "attachments"
        return {"answers": [{"attachments": [str(path) for path in sorted(folder.iterdir())]}]}


def _file(root: Path, agent: str, set_id: str, name: str, data: bytes = b"", size: int | None = None) -> str:
    folder = root / agent / set_id / "attachments"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "wb") as handle:
        handle.write(data)
        if size is not None:
            handle.truncate(size)  # sparse: a big file that costs the test nothing
    return attachment_uri(set_id, name)


async def test_a_file_over_what_a_resource_read_carries_is_refused_naming_the_http_route(tmp_path):
    # Read whole and base64'd with no cap: 20 MiB held ~105 MB at its peak.
    uri = _file(tmp_path, "planner", "shots", "big.png", size=MCP_MEDIA_MAX + 1)
    files = McpFiles(Sets(tmp_path), 100 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge) as refused:
            await files.read("planner", uri)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "GET /v1/sets/shots/attachments/big.png" in refused.value.message
    assert str(MCP_MEDIA_MAX + 1) in refused.value.message
    assert peak < 1024 * 1024, f"{peak / 2**20:.1f} MiB held to refuse a file"


async def test_a_file_too_big_for_a_stdio_agent_is_pointed_to_where_it_lies(tmp_path):
    """`askwright-bridge mcp` serves an agent on this machine, which may have
    no HTTP API to GET from: it is told the file's path."""
    uri = _file(tmp_path, "planner", "shots", "big.png", size=MCP_MEDIA_MAX + 1)
    with pytest.raises(TooLarge) as refused:
        await McpFiles(Sets(tmp_path), 100 * 1024 * 1024, local=True).read("planner", uri)
    path = tmp_path / "planner" / "shots" / "attachments" / "big.png"
    assert f"read it at {path} on this machine" in refused.value.message
    assert "HTTP" not in refused.value.message


async def test_a_file_under_it_is_read_byte_for_byte(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 1)
    uri = _file(tmp_path, "planner", "shots", "take.png", data)
    (content,) = (await McpFiles(Sets(tmp_path), 100 * 1024 * 1024).read("planner", uri)).contents
    assert base64.b64decode(content.blob) == data and content.mime_type == "image/png" and str(content.uri) == uri


async def test_a_slow_read_leaves_the_event_loop_free_and_reads_run_a_few_at_a_time(tmp_path, monkeypatch):
    """The encoding made slow (a big file on a busy machine): another
    coroutine keeps ticking meanwhile, and no more reads encode at once than
    an agent's turns, nor than everyone's."""
    real = base64.b64encode
    loop_thread = threading.get_ident()
    running, most, on_loop, counting = [0], [0], [], threading.Lock()

    def slow(data: bytes) -> bytes:
        on_loop.append(threading.get_ident() == loop_thread)
        with counting:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.3)  # (sleeps without the GIL, as a worker thread's read would)
        with counting:
            running[0] -= 1
        return real(data)

    monkeypatch.setattr(mcp_files.base64, "b64encode", slow)
    files = McpFiles(Sets(tmp_path), 100 * 1024 * 1024)
    uris = {agent: _file(tmp_path, agent, "shots", "take.png", b"\x89PNG" + os.urandom(1000))
            for agent in ("a", "b", "c")}
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    try:
        one = await files.read("a", uris["a"])
        assert base64.b64decode(one.contents[0].blob)[:4] == b"\x89PNG"
        assert on_loop == [False] and max(gaps, default=0) < 0.2  # the encoding's 0.3 s held no tick
        await asyncio.gather(*(files.read("a", uris["a"]) for _ in range(6)))
        assert most[0] == READS_PER_AGENT
        most[0] = 0
        await asyncio.gather(*(files.read(agent, uri) for agent, uri in uris.items() for _ in range(4)))
        assert most[0] == READS_AT_ONCE
    finally:
        ticker.cancel()
