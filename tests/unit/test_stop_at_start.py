"""SIGTERM while the bridge starts: the homeserver down (boot order, an
outage) must not keep a stop waiting.  The bridge as its own process, its
homeserver a port nobody listens on; nio asks again every few seconds for
ever, and a stop used to wait for that."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import yaml

from helpers.agents import free_port
from helpers.config import GOOD


def test_sigterm_while_the_homeserver_does_not_answer_at_start_exits_0_at_once(tmp_path):
    config = {**GOOD, "homeserver": {"url": f"http://127.0.0.1:{free_port()}"},
              "sets": {"root": str(tmp_path / "ask")}, "store": {"path": str(tmp_path / "bridge.sqlite")}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (tmp_path / "ask").mkdir()
    bridge = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        time.sleep(3)  # started, and asking the homeserver that is not there
        assert bridge.poll() is None, bridge.stdout.read().decode() if bridge.stdout else ""
        bridge.send_signal(signal.SIGTERM)
        code = bridge.wait(15)
    finally:
        bridge.kill()
        output = bridge.communicate()[0].decode()
    assert code == 0, output


def bridge_against(tmp_path, url: str) -> subprocess.Popen:
    config = {**GOOD, "homeserver": {"url": url}, "sets": {"root": str(tmp_path / "ask")},
              "store": {"path": str(tmp_path / "bridge.sqlite")}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    (tmp_path / "ask").mkdir()
    return subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)


def test_a_proxy_answering_502_for_a_homeserver_not_up_yet_is_waited_for(tmp_path):
    """nginx before a Synapse that is restarting answers 502 (503, 504): the
    bridge exited 1 at once, "did not answer as a Matrix homeserver: check
    homeserver.url", where a refused connection is waited for."""
    import http.server
    import threading

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>502 Bad Gateway</html>"
            self.send_response(502)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args) -> None:
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    bridge = bridge_against(tmp_path, f"http://127.0.0.1:{proxy.server_address[1]}")
    try:
        time.sleep(5)
        assert bridge.poll() is None, bridge.stdout.read().decode() if bridge.stdout else ""
        bridge.send_signal(signal.SIGTERM)
        code = bridge.wait(15)
    finally:
        bridge.kill()
        output = bridge.communicate()[0].decode()
        proxy.shutdown()
    assert code == 0, output
    assert "answered HTTP 502 (a proxy whose homeserver is not up yet?); trying again" in output, output


def test_sighup_is_logged_and_the_bridge_runs_on(tmp_path):
    """SIGHUP (a reload, the terminal gone) killed the bridge with no word,
    and systemd counts that a clean exit: never restarted."""
    bridge = bridge_against(tmp_path, f"http://127.0.0.1:{free_port()}")
    try:
        time.sleep(3)
        bridge.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert bridge.poll() is None, bridge.stdout.read().decode() if bridge.stdout else ""
        bridge.send_signal(signal.SIGTERM)
        code = bridge.wait(15)
    finally:
        bridge.kill()
        output = bridge.communicate()[0].decode()
    assert code == 0 and "SIGHUP: nothing to reload" in output, output
