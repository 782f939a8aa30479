"""A TCP relay in front of a server whose path can be cut the way a network
fails: nothing passes and nobody is told (no reset, no close; a new
connection is accepted and then hears nothing).  Once mended, new
connections work, while those open across the cut stay silent for good, as
behind a NAT or a proxy that lost its state.  Unlike a real drop, the
relay's kernel still acknowledges what reaches it, so a client sees only
silence: neither TCP keepalives nor ``tcp_user_timeout`` notice."""

from __future__ import annotations

import socket
import threading
import time


class Cable:
    def __init__(self, port: int):
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.generation = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def mend(self) -> None:
        self.cut.clear()

    def sever(self) -> None:
        """Cut: what is open now (or opens before ``mend``) never passes a byte again."""
        self.generation += 1
        self.cut.set()

    def refuse(self) -> None:
        """Nothing listens here any more: a new connection is refused (the server down, not the path)."""
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # (``refuse``)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        generation = self.generation
        self._hold(generation)
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        # Each chunk goes on at once, as a router forwards a packet: with Nagle's
        # algorithm on, a chunk following one not yet acknowledged would wait for
        # the server's delayed acknowledgement (40 ms) that no real network adds.
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(a, b, generation), daemon=True).start()

    def _hold(self, generation: int) -> None:
        # A dead network: bytes go nowhere, nobody is told.
        while self.cut.is_set() or generation != self.generation:
            time.sleep(0.05)

    def _pipe(self, src: socket.socket, dst: socket.socket, generation: int) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for end in (src, dst):
                    try:
                        end.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            self._hold(generation)
            try:
                dst.sendall(data)
            except OSError:
                return
