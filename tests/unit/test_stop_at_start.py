"""SIGTERM while the bridge starts: the homeserver down (boot order, an
outage) must not keep a stop waiting.  The bridge as its own process, its
homeserver a port nobody listens on; nio asks again every few seconds for
ever, and a stop used to wait for that.  And what else may come meanwhile:
a proxy's 502 for a homeserver not up yet, a SIGHUP."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import yaml

from helpers.agents import free_port
from helpers.config import GOOD


def bridge_against(tmp_path, url: str, **more: object) -> subprocess.Popen:
    config = {**GOOD, "homeserver": {"url": url}, "sets": {"root": str(tmp_path / "ask")},
              "store": {"path": str(tmp_path / "bridge.sqlite")}, **more}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (tmp_path / "ask").mkdir()
    return subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)


def stopped(bridge: subprocess.Popen, after: float, meanwhile: Callable[[], None] = lambda: None) -> tuple[int, str]:
    """The bridge still running ``after`` seconds (and ``meanwhile`` done),
    then SIGTERM: its exit code and what it logged."""
    try:
        time.sleep(after)
        meanwhile()
        assert bridge.poll() is None, bridge.stdout.read().decode() if bridge.stdout else ""
        bridge.send_signal(signal.SIGTERM)
        code = bridge.wait(15)
    finally:
        bridge.kill()
        output = bridge.communicate()[0].decode()
    return code, output


def test_sigterm_while_the_homeserver_does_not_answer_at_start_exits_0_at_once(tmp_path):
    code, output = stopped(bridge_against(tmp_path, f"http://127.0.0.1:{free_port()}"), 3)
    assert code == 0, output


class Gateway(http.server.BaseHTTPRequestHandler):
    """A proxy whose homeserver is not up: 502 to everything."""

    def do_GET(self) -> None:
        body = b"<html>502 Bad Gateway</html>"
        self.send_response(502)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args) -> None:
        pass


def test_a_proxy_answering_502_for_a_homeserver_not_up_yet_is_waited_for(tmp_path):
    """nginx before a Synapse that is restarting answers 502 (503, 504): the
    bridge exited 1 at once, "did not answer as a Matrix homeserver: check
    homeserver.url", where a refused connection is waited for."""
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        code, output = stopped(bridge_against(tmp_path, f"http://127.0.0.1:{proxy.server_address[1]}"), 5)
    finally:
        proxy.shutdown()
    assert code == 0, output
    assert "answered HTTP 502 (a proxy whose homeserver is not up yet?); trying again" in output, output


def test_sighup_is_logged_and_the_bridge_runs_on(tmp_path):
    """SIGHUP (a reload, the terminal gone) killed the bridge with no word,
    and systemd counts that a clean exit: never restarted."""
    bridge = bridge_against(tmp_path, f"http://127.0.0.1:{free_port()}")
    code, output = stopped(bridge, 3, lambda: (bridge.send_signal(signal.SIGHUP), time.sleep(1)))
    assert code == 0 and "SIGHUP: nothing to reload" in output, output


def test_the_agents_door_says_the_bridge_is_starting_while_its_homeserver_does_not_answer(tmp_path):
    """Only /health was served while the start waited for the homeserver:
    /v1 answered aiohttp's plain-text 404, which a client took for "no such
    set", and /mcp the same, no JSON-RPC error its client could show."""
    import json
    import urllib.error
    import urllib.request

    port = free_port()
    bridge = bridge_against(tmp_path, f"http://127.0.0.1:{free_port()}",
                            metrics={"enabled": True, "listen": f"127.0.0.1:{port}"},
                            agents={"planner": {"token": "planner-token-0123456789"}})
    said: dict[str, tuple[int, dict, str]] = {}

    def ask() -> None:
        for path, data in (("/v1/sets/plan", None), ("/mcp", b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}')):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers={
                "Authorization": "Bearer planner-token-0123456789", "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream"})
            try:
                urllib.request.urlopen(request, timeout=5)
            except urllib.error.HTTPError as exc:
                said[path] = (exc.code, json.loads(exc.read()), exc.headers.get("Retry-After", ""))

    code, output = stopped(bridge, 4, ask)
    assert code == 0, output
    status, body, retry = said["/v1/sets/plan"]
    assert (status, body["error"], retry) == (503, "starting", "5"), said
    status, body, retry = said["/mcp"]
    assert status == 503 and "starting" in body["error"]["message"] and retry == "5", said
