"""Files people send are downloaded over connections of their own: 110 of
them trickling in from a slow media store took every connection of the
client's pool (aiohttp's 100), and the bridge's syncs and sends waited
behind them (an answer in another room recorded 80 s late)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from nio import AsyncClient

from bridge.service.transport.matrix import NioTransport
from bridge.service.transport.mediasession import MEDIA_CONNECTIONS


async def test_slow_downloads_leave_the_clients_own_requests_their_connections():
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b"\x89")
        await asyncio.sleep(60)  # the rest never comes within the test
        return response

    async def versions(_request: web.Request) -> web.Response:
        return web.json_response({"versions": ["v1.11"]})

    app = web.Application()
    app.router.add_get("/_matrix/client/v1/media/download/{server}/{media}", trickle)
    app.router.add_get("/_matrix/client/versions", versions)
    server = TestServer(app)
    await server.start_server()
    client = AsyncClient(str(server.make_url("")).rstrip("/"), "@bot:hs")
    client.access_token = "token"
    transport = NioTransport(client)
    started = asyncio.Event()
    begun = 0

    async def one(n: int) -> None:
        nonlocal begun
        async with transport.download(f"mxc://hs/file{n}", stall_seconds=30) as body:
            async for _chunk in body.chunks:
                begun += 1
                if begun == MEDIA_CONNECTIONS:  # (the rest wait for one of those connections, or, before, the client's)
                    started.set()
                await asyncio.sleep(60)

    downloads = [asyncio.create_task(one(n)) for n in range(110)]
    try:
        await asyncio.wait_for(started.wait(), 20)
        await asyncio.sleep(0.5)
        asked = time.monotonic()
        response = await asyncio.wait_for(client.send("GET", "/_matrix/client/versions"), 10)
        assert response.status == 200 and time.monotonic() - asked < 2
    finally:
        for task in downloads:
            task.cancel()
        await asyncio.gather(*downloads, return_exceptions=True)
        await transport.media.close()
        await client.close()
        await server.close()


@contextlib.asynccontextmanager
async def _serving(handler) -> AsyncIterator[NioTransport]:
    """A transport whose homeserver's media downloads ``handler`` answers."""
    app = web.Application()
    app.router.add_get("/_matrix/client/v1/media/download/{server}/{media}", handler)
    async with _homeserver(app) as transport:
        yield transport


@contextlib.asynccontextmanager
async def _homeserver(app: web.Application) -> AsyncIterator[NioTransport]:
    """A transport whose homeserver is ``app``."""
    server = TestServer(app)
    await server.start_server()
    client = AsyncClient(str(server.make_url("")).rstrip("/"), "@bot:hs")
    client.access_token = "token"
    transport = NioTransport(client)
    try:
        yield transport
    finally:
        await transport.media.close()
        await client.close()
        await server.close()


async def _kept_through(handler, data: bytes, tmp_path) -> None:
    """A screenshot of ``data`` fetched from the homeserver ``handler`` plays: kept whole."""
    from bridge.service.answering import attachments

    (tmp_path / "set").mkdir()
    async with _serving(handler) as transport:
        saved, refused = await attachments.fetch_bounded(_shot(data), str(tmp_path / "set"), "q1", 1,
                                                         transport.download, limit=1024 * 1024)
    assert refused is None and (tmp_path / "set" / saved).read_bytes() == data


def _shot(data: bytes) -> dict:
    return {"msgtype": "m.image", "body": "shot.png", "url": "mxc://remote.example/shot",
            "info": {"size": len(data), "mimetype": "image/png"}}


async def test_a_homeserver_fetching_the_file_over_federation_is_waited_for_and_a_stalled_body_is_not(
        tmp_path, monkeypatch):
    """Synapse has a remote file whole before it sends the bridge a byte: a
    30 MB file over a slow federation link gave nothing for a minute, and
    the stall bound (aiohttp's, on reading) refused it on every try.  The
    response may take as long as the file at the slowest rate; the body's
    bytes, once they come, may not stall."""
    from bridge.service.answering import attachments

    data = bytes(range(256)) * 40  # 10,240 bytes
    monkeypatch.setattr(attachments, "TRY_SECONDS", 0.5)
    monkeypatch.setattr(attachments, "SLOWEST_RATE", 4096)  # the file's time: 2.5 s
    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.0)
    stall_midway = False

    async def remote(request: web.Request) -> web.StreamResponse:
        if not stall_midway:
            await asyncio.sleep(1.5)  # fetching it from the sender's server
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": str(len(data))})
        await response.prepare(request)
        await response.write(data[:4096])
        if stall_midway:
            await asyncio.sleep(30)
        await response.write(data[4096:])
        return response

    (tmp_path / "set").mkdir()
    async with _serving(remote) as transport:
        saved, refused = await attachments.fetch_bounded(_shot(data), str(tmp_path / "set"), "q1", 1,
                                                         transport.download, limit=1024 * 1024)
        assert refused is None and saved is not None
        assert (tmp_path / "set" / saved).read_bytes() == data
        stall_midway = True
        began = time.monotonic()
        saved, refused = await attachments.fetch_bounded(_shot(data), str(tmp_path / "set"), "q1", 2,
                                                         transport.download, limit=1024 * 1024)
        assert (saved, refused) == (None, "attachment_not_fetched")
        assert time.monotonic() - began < 6  # three tries, each cut 0.5 s after the body stopped


async def test_a_file_on_a_server_the_homeserver_does_not_reach_is_fetched_once_it_does(tmp_path, monkeypatch):
    """Synapse answers 502 while the file's server is down: three tries in
    three seconds, and the file was refused for good ("could not be
    downloaded whole"), though the server was back a minute later."""
    from bridge.service.answering import attachments

    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.01)
    data = b"\x89PNG" + bytes(range(256)) * 8
    asked = []

    async def remote(_request: web.Request) -> web.Response:
        asked.append(time.monotonic())
        if len(asked) <= 8:
            return web.json_response({"errcode": "M_UNKNOWN", "error": "Failed to fetch remote media"}, status=502)
        return web.Response(body=data, headers={"Content-Type": "image/png"})

    await _kept_through(remote, data, tmp_path)
    assert len(asked) == 9


async def test_a_federated_file_past_what_the_homeserver_fetches_is_too_large_not_unreachable(tmp_path, monkeypatch):
    """Synapse fetches another server's file up to its own max_upload_size
    and answers 502 M_TOO_LARGE past it: taken for a server not reached,
    tried for half a minute, and the person told to send it again once the
    server was back, in vain."""
    from bridge.service.answering import attachments

    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.01)
    asked = []

    async def too_large(_request: web.Request) -> web.Response:
        asked.append(1)
        return web.json_response({"errcode": "M_TOO_LARGE", "error": "Content-Length exceeds the maximum"},
                                 status=502)

    (tmp_path / "set").mkdir()
    async with _serving(too_large) as transport:
        saved, problem = await attachments.fetch_bounded(_shot(b"x" * 100), str(tmp_path / "set"), "q1", 1,
                                                         transport.download, limit=2**20)
    assert (saved, problem) == (None, "attachment_too_large")
    assert len(asked) <= 2  # (the authenticated route, no retry)


@pytest.mark.parametrize("data", [os.urandom(10_000), b"hello world\n"], ids=["random bytes", "a short text"])
async def test_a_file_a_proxy_compresses_is_kept_whole(tmp_path, monkeypatch, data):
    """aiohttp asked for gzip and unpacked it, while the Content-Length was
    the packed one: every file that packs larger (ciphertext, random bytes,
    a short text) was "cut short" on every try, the person asked to send it
    again, in vain.  The file is asked for as stored; a proxy that packs it
    all the same makes no promise of its length."""
    from bridge.service.answering import attachments

    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.0)
    asked: list[str | None] = []

    async def packing(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding"))
        return web.Response(body=gzip.compress(data), headers={"Content-Encoding": "gzip"})

    (tmp_path / "set").mkdir()
    async with _serving(packing) as transport:
        saved, problem = await attachments.fetch_bounded(_shot(data), str(tmp_path / "set"), "q1", 1,
                                                         transport.download, limit=2**20)
    assert problem is None and (tmp_path / "set" / saved).read_bytes() == data
    assert asked[0] == "identity"


@pytest.mark.parametrize("asked", ["body", "header"])
async def test_a_homeserver_limiting_downloads_is_waited_out_not_taken_for_a_failure(tmp_path, monkeypatch, asked):
    """Synapse answers 429 when remote media is fetched faster than it allows:
    three tries 1 s and 2 s apart, and the person was told to send the file
    again.  The wait it names (the error's retry_after_ms, or Retry-After) is
    waited out, and the file kept."""
    from bridge.service.answering import attachments

    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.01)
    data = b"\x89PNG" + bytes(range(256)) * 8
    asked_at: list[float] = []

    async def limiting(_request: web.Request) -> web.Response:
        asked_at.append(time.monotonic())
        if len(asked_at) <= 4:
            if asked == "body":
                return web.json_response({"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests",
                                          "retry_after_ms": 700}, status=429)
            return web.json_response({"errcode": "M_LIMIT_EXCEEDED"}, status=429, headers={"Retry-After": "1"})
        return web.Response(body=data, headers={"Content-Type": "image/png"})

    await _kept_through(limiting, data, tmp_path)
    gaps = [later - earlier for earlier, later in zip(asked_at, asked_at[1:])]
    assert len(asked_at) == 5 and min(gaps) >= (0.65 if asked == "body" else 0.95), gaps


async def test_a_homeserver_limiting_downloads_for_good_is_said_as_such_not_as_unreachable(tmp_path, monkeypatch):
    """Five minutes of 429s ended in "could not be reached for half a
    minute. Please send it again once it is back": the server was there."""
    from bridge.service.answering import attachments

    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.01)
    monkeypatch.setattr(attachments, "RATE_LIMITED_PATIENCE", 0.5)

    async def limiting(_request: web.Request) -> web.Response:
        return web.json_response({"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 100}, status=429)

    (tmp_path / "set").mkdir()
    async with _serving(limiting) as transport:
        saved, problem = await attachments.fetch_bounded(_shot(b"x" * 100), str(tmp_path / "set"), "q1", 1,
                                                         transport.download, limit=2**20)
    assert (saved, problem) == (None, "attachment_rate_limited")


async def test_a_small_file_behind_a_full_pool_of_slow_ones_waits_its_turn_and_is_kept(tmp_path, monkeypatch):
    """Several people send videos at once: the next file, a screenshot,
    waited for one of the media's connections inside its own clocks, timed
    out in the queue three times, and its person was told to send it again.
    (The pool shrunk to 2 connections here, from 32.)"""
    import asyncio

    from bridge.service.answering import attachments
    from bridge.service.transport import mediasession

    monkeypatch.setattr(mediasession, "MEDIA_CONNECTIONS", 2)
    monkeypatch.setattr(attachments, "TRY_SECONDS", 1.0)
    monkeypatch.setattr(attachments, "SLOWEST_RATE", 10 ** 9)  # each try's bound: about 1 s
    monkeypatch.setattr(attachments, "RETRY_PAUSE", 0.05)
    video, shot = os.urandom(60_000), b"\x89PNG" + os.urandom(5000)

    async def media(request: web.Request) -> web.StreamResponse:
        if request.match_info["media"] == "shot":
            return web.Response(body=shot, headers={"Content-Type": "image/png"})
        response = web.StreamResponse(headers={"Content-Type": "video/mp4", "Content-Length": str(len(video))})
        await response.prepare(request)
        for at in range(0, len(video), 10_000):  # 0.6 s a video: within its own bound, slow for the queue
            await response.write(video[at:at + 10_000])
            await asyncio.sleep(0.1)
        return response

    (tmp_path / "set").mkdir()
    turns = asyncio.Semaphore(mediasession.MEDIA_CONNECTIONS)
    videos = [{"msgtype": "m.video", "body": "v.mp4", "url": f"mxc://remote.example/video{n}",
               "info": {"size": len(video), "mimetype": "video/mp4"}} for n in range(12)]  # 3.6 s of queue
    async with _serving(media) as transport:
        slow = [asyncio.ensure_future(attachments.fetch_bounded(content, str(tmp_path / "set"), "q", n,
                                                                transport.download, limit=1024 * 1024, turns=turns))
                for n, content in enumerate(videos)]
        await asyncio.sleep(0.2)
        saved, refused = await attachments.fetch_bounded(_shot(shot), str(tmp_path / "set"), "q", 999,
                                                         transport.download, limit=1024 * 1024, turns=turns)
        videos_kept = await asyncio.gather(*slow)
    assert refused is None and (tmp_path / "set" / saved).read_bytes() == shot
    assert [problem for _path, problem in videos_kept] == [None] * len(videos)


async def test_an_encrypted_rooms_file_over_the_upload_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """Media for an encrypted room was read whole and encrypted on the event
    loop (0.5 s per 100 MB held every room and /health) and only then
    compared with the homeserver's upload limit."""
    from pathlib import Path

    from bridge.service.transport.matrix import UploadRefused

    uploads: list[int] = []

    async def config(_request: web.Request) -> web.Response:
        return web.json_response({"m.upload.size": 1000})

    async def upload(request: web.Request) -> web.Response:
        uploads.append(len(await request.read()))
        return web.json_response({"content_uri": "mxc://hs/ciphertext"})

    app = web.Application()
    app.router.add_get("/_matrix/client/v1/media/config", config)
    app.router.add_post("/_matrix/media/v3/upload", upload)
    read: list[str] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or real(self))
    async with _homeserver(app) as transport:
        (tmp_path / "big.mp4").write_bytes(b"\x00" * 1001)
        with pytest.raises(UploadRefused):
            await transport.upload_encrypted(tmp_path / "big.mp4", "video/mp4", "big.mp4")
        assert read == [] and uploads == []
        (tmp_path / "small.png").write_bytes(b"\x89PNG" + b"\x00" * 996)
        sent = await transport.upload_encrypted(tmp_path / "small.png", "image/png", "small.png")
        assert sent["url"] == "mxc://hs/ciphertext" and uploads == [1000] and "key" in sent


async def test_a_hundred_megabytes_posted_into_an_encrypted_room_never_sit_in_memory(tmp_path):
    """Media for an encrypted room was read whole, encrypted whole and the
    ciphertext kept for the upload: about 300 MB held for a 100 MB clip.
    The homeserver here reads the whole body; what it got decrypts, with
    the keys the event would carry, to the file byte for byte."""
    import hashlib
    import tracemalloc

    import unpaddedbase64
    from Crypto.Cipher import AES
    from Crypto.Util import Counter

    mib = 1024 * 1024
    block = os.urandom(mib)
    clip, whole = tmp_path / "clip.mp4", hashlib.sha256()
    with open(clip, "wb") as handle:
        for _ in range(100):
            handle.write(block)
            whole.update(block)
    received = tmp_path / "received"
    uploads: list[int] = []

    async def config(_request: web.Request) -> web.Response:
        return web.json_response({"m.upload.size": 200 * mib})

    async def upload(request: web.Request) -> web.Response:
        size = 0
        with open(received, "wb") as handle:
            async for chunk in request.content.iter_chunked(mib):
                handle.write(chunk)
                size += len(chunk)
        uploads.append(size)
        return web.json_response({"content_uri": "mxc://hs/ciphertext"})

    app = web.Application()
    app.router.add_get("/_matrix/client/v1/media/config", config)
    app.router.add_post("/_matrix/media/v3/upload", upload)
    async with _homeserver(app) as transport:
        tracemalloc.start()
        try:
            sent = await transport.upload_encrypted(clip, "video/mp4", "clip.mp4")
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert sent["url"] == "mxc://hs/ciphertext" and uploads == [100 * mib]
    assert peak < 16 * mib, f"{peak / mib:.1f} MiB held while posting 100 MiB encrypted"
    key = unpaddedbase64.decode_base64(sent["key"]["k"])
    iv = unpaddedbase64.decode_base64(sent["iv"])
    cipher = AES.new(key, AES.MODE_CTR, counter=Counter.new(64, prefix=iv[:8], initial_value=0))
    hashed, plain = hashlib.sha256(), hashlib.sha256()
    with open(received, "rb") as handle:
        while chunk := handle.read(mib):
            hashed.update(chunk)
            plain.update(cipher.decrypt(chunk))
    assert unpaddedbase64.encode_base64(hashed.digest()) == sent["hashes"]["sha256"]
    assert plain.digest() == whole.digest()
