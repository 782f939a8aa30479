"""A TCP relay in front of a homeserver's federation listener: the way other
homeservers reach it, which a test can cut (connections refused, open ones
dropped) and mend, while the homeserver itself keeps running and reaching out
(a one-way partition: its own requests still get through)."""

from __future__ import annotations

import socket
import threading

from bridge.devserver import free_port


class Relay:
    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def mend(self) -> None:
        """Reachable again (or for the first time)."""
        if self._listener is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Unreachable: new connections refused, open ones dropped."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)  # shut down first: that wakes the thread blocked in accept()
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            _close(conn)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):  # each chunk on at once, as a router does (no Nagle wait)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, sink}
            _close(source)
            _close(sink)



def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
