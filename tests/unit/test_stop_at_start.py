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
