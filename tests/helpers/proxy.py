"""HAProxy from Debian's packages in front of the bridge's instances, run
with the example config shipped in contrib/ (addresses from the environment)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "contrib" / "haproxy" / "askwright-bridge.cfg"


class HAProxy:
    def __init__(self, listen: str, bridges: list[str], log: Path):
        self.listen = listen
        self.bridges = bridges
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        env = {**os.environ, "ASKWRIGHT_PROXY_LISTEN": self.listen,
               **{f"ASKWRIGHT_BRIDGE_{n + 1}": address for n, address in enumerate(self.bridges)}}
        self.process = subprocess.Popen([binary, "-db", "-f", str(CONFIG)], env=env,
                                        stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        host, _, port = self.listen.rpartition(":")
        deadline = time.monotonic() + 10
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                socket.create_connection((host, int(port)), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
