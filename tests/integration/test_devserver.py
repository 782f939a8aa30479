"""The suite's homeservers start on ports of their own.

Two test workers each picking a free port can be handed the same one; the
second homeserver then can't listen, while the first answers on its port.
Taking that answer for its own, a worker ran every test against a stranger
(its shared secret refused: "HMAC incorrect", 70 tests in errors)."""

from __future__ import annotations

import http.server
import threading

import pytest

import bridge.devserver as devserver
from bridge.devserver import Synapse, free_port, listens

pytestmark = pytest.mark.integration


class _Versions(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the handler's name
        body = b'{"versions": ["v1.11"]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def test_a_homeserver_whose_port_another_took_starts_on_another(tmp_path, monkeypatch):
    stranger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Versions)  # answers as a homeserver would
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    taken = stranger.server_address[1]
    ports = iter([taken])
    monkeypatch.setattr(devserver, "free_port", lambda: next(ports, None) or free_port())
    server = Synapse(tmp_path / "hs")
    try:
        server.start()
        assert server.port != taken and listens(server.process.pid, server.port)
        assert server.register("ana")["user_id"] == "@ana:localhost"  # its own shared secret
    finally:
        server.stop()
        stranger.shutdown()


def test_a_homeserver_stopped_while_it_starts_is_not_left_running(tmp_path, monkeypatch):
    """Ctrl-C while `make demo`'s Synapse started: it runs in a session of
    its own, which the terminal's Ctrl-C does not reach, and it was left
    serving on the demo's port, its parent gone."""
    server = Synapse(tmp_path / "hs")
    real_wait = Synapse.wait_ready

    def interrupted(self, timeout):
        real_wait(self, timeout)  # up and serving, then the person presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(Synapse, "wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.process.poll() is not None, "Synapse still running"
