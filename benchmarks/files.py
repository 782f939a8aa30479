"""A file a person sends, sent -> durable in ``attachments/``, beside the
homeserver's own download of it.

    python benchmarks/files.py [--size 10000000] [--rounds 3]

One Synapse, one run, bot mode in a plain room.  Each round a person
uploads ``--size`` random bytes and sends them as an ``m.file`` in the
thread of a question of their own; the clock runs from the send until the
bridge has renamed the whole file into ``<set>/attachments/`` (it does so
only once the file is whole and fsynced).  The reference is a bare aiohttp
GET of the same mxc from the same homeserver (authenticated media, the whole
body read), timed right after: what any client pays to fetch the file.  The
difference is what the bridge adds: noticing the event, and streaming the
body to disk.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import os
import statistics
import time
from typing import Any

import aiohttp
from nio import UploadResponse

from _world import World, question_set, send, world


def in_thread(question_event_id: str, content: dict[str, Any]) -> dict[str, Any]:
    return {**content, "m.relates_to": {"rel_type": "m.thread", "event_id": question_event_id,
                                        "is_falling_back": True, "m.in_reply_to": {"event_id": question_event_id}}}


async def bare_download(homeserver: str, token: str, mxc: str) -> tuple[float, str]:
    """Seconds for a bare GET of ``mxc``'s whole body, and its sha256."""
    server, media_id = mxc.removeprefix("mxc://").split("/", 1)
    digest = hashlib.sha256()
    async with aiohttp.ClientSession() as http:
        started = time.perf_counter()
        async with http.get(f"{homeserver}/_matrix/client/v1/media/download/{server}/{media_id}",
                            headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 200, response.status
            async for chunk in response.content.iter_any():
                digest.update(chunk)
        return time.perf_counter() - started, digest.hexdigest()


async def measure(w: World, size: int = 10_000_000, rounds: int = 3, timeout: float = 120) -> dict[str, Any]:
    w.sets_root = w.base / "sets-files"
    folder = w.add_set(question_set("files", rounds))
    config = w.config(store={"path": str(w.base / "files.sqlite")})
    person = w.client(w.person)
    w.start_bridge(config)
    try:
        questions = await w.question_events(person, rounds, prefix="files/")
        bridge_s, bare_s = [], []
        for n in range(rounds):
            data = os.urandom(size)
            upload, _ = await person.upload(io.BytesIO(data), content_type="application/octet-stream",
                                            filename=f"clip-{n}.bin", filesize=size)
            assert isinstance(upload, UploadResponse), upload
            saved = folder / "attachments" / f"q{n}-1.bin"
            content = in_thread(questions[f"files/q{n}"]["event_id"], {
                "msgtype": "m.file", "body": f"clip-{n}.bin", "filename": f"clip-{n}.bin", "url": upload.content_uri,
                "info": {"mimetype": "application/octet-stream", "size": size}})
            started = time.perf_counter()
            await send(person, w.room_id, content)
            while not saved.exists():  # renamed into place only once whole and fsynced
                if time.perf_counter() - started > timeout:
                    raise TimeoutError(f"{saved.name} not in attachments/ after {timeout} s")
                if w.bridge is not None and w.bridge.poll() is not None:
                    raise RuntimeError("the bridge exited; see bridge.log")
                await asyncio.sleep(0.002)
            bridge_s.append(time.perf_counter() - started)
            assert hashlib.sha256(saved.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
            seconds, digest = await bare_download(w.synapse.url, w.person["access_token"], upload.content_uri)
            assert digest == hashlib.sha256(data).hexdigest()
            bare_s.append(seconds)
    finally:
        w.stop_bridge(grace=10)
        await person.close()
    bridge_ms, bare_ms = round(statistics.median(bridge_s) * 1000), round(statistics.median(bare_s) * 1000)
    return {"size": size, "rounds": rounds, "bridge_ms": bridge_ms, "bare_download_ms": bare_ms,
            "overhead_ms": bridge_ms - bare_ms, "bridge_samples_ms": [round(s * 1000) for s in bridge_s],
            "bare_samples_ms": [round(s * 1000) for s in bare_s]}


def row(f: dict[str, Any]) -> tuple[str, str, str, str, str]:
    return (f"a {f['size'] / 1e6:g} MB file, sent -> durable in attachments/ (ms, median of {f['rounds']})",
            f"{f['bridge_ms']}", f"bare GET of the same mxc {f['bare_download_ms']} (+{f['overhead_ms']})", "-", "-")


async def main(args: argparse.Namespace) -> None:
    async with world() as w:
        figures = await measure(w, args.size, args.rounds)
    print(figures)
    print(" | ".join(row(figures)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000_000, help="bytes per file (10 MB)")
    parser.add_argument("--rounds", type=int, default=3, help="files sent, one at a time (3)")
    asyncio.run(main(parser.parse_args()))
