"""A request that asks before it sends its body (``Expect: 100-continue``),
over a raw socket: what the server answers before any of the body is sent."""

from __future__ import annotations

import asyncio


class Asked:
    """A request sent with ``Expect: 100-continue`` over a raw socket, its
    body held back until the bridge says to send it, as curl does."""

    def __init__(self, port: int, method: str, path: str, headers: list[tuple[str, str]], length: int,
                 expect: str = "100-continue"):
        self.port, self.length = port, length
        self.head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     + "".join(f"{name}: {value}\r\n" for name, value in headers)
                     + f"Content-Length: {length}\r\nExpect: {expect}\r\n\r\n").encode()

    async def __aenter__(self) -> Asked:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.head)
        await self.writer.drain()
        return self

    async def __aexit__(self, *_exc) -> None:
        self.writer.close()

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The next response: (status, headers, body)."""
        head = (await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1")
        lines = head.split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:] if line)
        length = int(headers.get("Content-Length", "0"))
        body = await asyncio.wait_for(self.reader.readexactly(length), 10) if length else b""
        return int(lines[0].split()[1]), headers, body
