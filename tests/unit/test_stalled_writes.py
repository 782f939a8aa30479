"""A client that stops reading a response, or reads a trickle of it, is cut
off; one that reads at a real link's pace (its progress seen in the
kernel's send queue too, which the transport's buffer shows only in bursts),
and a long poll with nothing sent yet, are not (a real aiohttp listener,
real sockets)."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from bridge.service.operators import stalled
from bridge.service.operators.health import runner_for

BIG = 20 * 1024 * 1024


async def _serve() -> tuple[web.AppRunner, int]:
    app = web.Application()

    async def big(_request: web.Request) -> web.Response:
        return web.Response(body=b"x" * BIG)

    async def long_poll(_request: web.Request) -> web.Response:
        await asyncio.sleep(2.5)
        return web.Response(text="done")

    app.router.add_get("/big", big)
    app.router.add_get("/poll", long_poll)
    runner = runner_for(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def _ask(port: int, path: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server cut the connection (what was sent read and dropped)."""
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_a_client_that_stops_reading_is_cut_off_and_a_reader_and_a_long_poll_are_not(monkeypatch):
    monkeypatch.setattr(stalled, "STALLED_SECONDS", 2.0)
    monkeypatch.setattr(stalled, "LOOK_EVERY", 0.2)

    async def scenario() -> tuple[bool, bool, int, bool]:
        runner, port = await _serve()
        try:
            silent = _ask(port, "/big")
            reader = _ask(port, "/big")
            poll = _ask(port, "/poll")
            got = 0
            # 6 s, the cut due after about 2.2 s; then looked for a few times
            # more, 3 s apart (each look reads what was sent, which a look
            # more often than the cut's 2 s would count as reading): a loaded
            # machine (the suite's other worker) must not make it look served.
            for _ in range(120):  # the reader takes a little every 50 ms
                await asyncio.sleep(0.05)
                try:
                    got += len(reader.recv(256 * 1024))
                except BlockingIOError:
                    pass
            silent_cut = await asyncio.to_thread(_closed, silent)
            for _ in range(3):
                if silent_cut:
                    break
                await asyncio.sleep(3)
                silent_cut = await asyncio.to_thread(_closed, silent)
            reader_cut = await asyncio.to_thread(_closed, reader)
            poll_answered = False
            for _ in range(40):
                await asyncio.sleep(0.1)
                try:
                    poll_answered = b"done" in poll.recv(4096)
                except BlockingIOError:
                    continue
                break
            for sock in (silent, reader, poll):
                sock.close()
            return silent_cut, reader_cut, got, poll_answered
        finally:
            await runner.cleanup()

    silent_cut, reader_cut, got, poll_answered = asyncio.run(scenario())
    assert silent_cut
    assert not reader_cut and got > 100_000  # slow, and still served
    assert poll_answered


class _Sending:
    """What ``look`` reads of a connection: bytes left to send, going down as the client reads."""

    def __init__(self, left: int) -> None:
        self.left, self.aborted = left, False

    def get_write_buffer_size(self) -> int:
        return self.left

    def get_extra_info(self, _name: str) -> None:
        return None

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_a_client_reading_a_trickle_of_a_big_response_is_cut_off_one_reading_steadily_is_not():
    """Any progress at all kept a connection: a client taking 2 KB a second
    of a 13 MB view held its memory for hours.  The average over the window
    must be MIN_RATE; a client at twice that is served however long it takes."""
    now = [0.0]
    watch = stalled.StalledWrites(stalled_after=60, every=5, clock=lambda: now[0])
    trickle, steady = _Sending(13_000_000), _Sending(13_000_000)
    for connection in (trickle, steady):
        watch._watched[connection] = (0, now[0])
    for _ in range(60):  # five minutes, looked at every 5 s
        now[0] += 5
        trickle.left -= 5 * 2048
        steady.left -= 5 * 2 * stalled.MIN_RATE
        watch.look()
    assert trickle.aborted and not steady.aborted
