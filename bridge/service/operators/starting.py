"""/health while a start waits for its store: a PostgreSQL that can't be
reached yet (starting with the machine, restarting, full) is waited for
before the bridge's own listener exists.  Meanwhile the same address answers
503, ``"ready": false`` and why, so an orchestrator's probe sees an instance
alive and waiting, not a refused connection (which reads as dead, and is
restarted).  The standard library's server in a thread of its own: the wait
runs before the event loop, and a start that waits for nothing loads none of it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_STARTED_AT_MOST = 5.0  # seconds a request may take to be read: a silent client holds no thread for ever


def health_address(config: Any) -> tuple[str, int] | None:
    """Where the bridge serves /health once started (None: nowhere)."""
    if config.appservice.enabled:
        return config.appservice.listen_host_port
    if config.metrics.enabled or config.agents:
        return config.metrics.listen_host_port
    return None


class StartingHealth:
    """Serves the waiting start's /health until ``close``."""

    def __init__(self, address: tuple[str, int]):
        self.why = "starting"
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = _STARTED_AT_MOST

            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                if self.path.split("?", 1)[0] == "/health":
                    self._send({"live": True, "ready": False, "role": "starting", "waiting_for": owner.why})
                else:
                    self._send({"errcode": "M_UNKNOWN", "error": f"the bridge is starting ({owner.why})"})

            do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815 - a transaction or an agent's call: not yet

            def _send(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Retry-After", "5")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass  # a probe every few seconds is not worth a line

        self.server = ThreadingHTTPServer(address, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="starting-health", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving and free the address for the bridge's own listener."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
