"""A throwaway local Synapse: what ``make demo`` and the test suite run.

It is a real homeserver (the ``matrix-synapse`` package) on 127.0.0.1 with
SQLite, shared-secret registration, cheap password hashing and rate limits
relaxed so tests measure the bridge, not the limiter.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVER_NAME = "localhost"


_HANDED_OUT: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port free now, for a server started a moment later.

    Chosen below the kernel's ephemeral range, so no outgoing connection and
    no other ``bind(port 0)`` is handed it in between; at random, so two
    processes choosing at once rarely meet; never twice in one process, so two
    servers set up before either listens get different ports."""
    top = _ephemeral_start()
    bottom = min(20000, top // 2)
    for _ in range(200):
        port = secrets.randbelow(top - bottom) + bottom
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as sock:  # a crowded range: whatever the kernel offers
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PortTaken(RuntimeError):
    """The homeserver could not listen: its port was taken meanwhile."""


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on TCP ``port``
    (read from Linux's /proc; True where that can't be read, as before)."""
    try:
        inodes = set()
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except (OSError, ValueError):
        return True
    return any(_link(fd) in inodes for fd in fds)


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed meanwhile
        return ""


def first_free_port(preferred: int, tries: int = 50) -> int:
    """``preferred`` when nothing listens there, else the next free port after
    it: ``make demo`` keeps one address run after run, so a client set up
    once can be pointed at it again."""
    for port in range(preferred, preferred + tries):
        with socket.socket() as sock:
            # As the homeserver binds it: the last run's closed connections
            # (TIME_WAIT for a minute) do not make the port taken.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen()
            except OSError:
                continue
            return port
    return free_port()


def _relaxed_limits(per_second: float) -> dict[str, Any]:
    limit = {"per_second": per_second, "burst_count": max(per_second, 10)}
    return {
        "rc_message": limit,
        "rc_registration": limit,
        "rc_login": {"address": limit, "account": limit, "failed_attempts": limit},
        "rc_joins": {"local": limit, "remote": limit},
        "rc_joins_per_room": limit,
        "rc_invites": {"per_room": limit, "per_user": limit, "per_issuer": limit},
        "rc_admin_redaction": limit,
        "rc_room_creation": limit,
        "rc_presence": {"per_user": limit},
        "rc_media_create": limit,
        "rc_reports": limit,
    }


@dataclass
class Synapse:
    """One homeserver process with its data under ``data_dir``."""

    data_dir: Path
    port: int = 0
    appservice_files: list[str] = field(default_factory=list)
    rate_limit_per_second: float = 10000
    extra_config: dict[str, Any] = field(default_factory=dict)
    # MSC4140 delayed events (a question closes on time while the bridge is
    # down); False starts a homeserver without them, as older ones are.
    delayed_events: bool = True
    process: subprocess.Popen | None = None
    shared_secret: str = ""
    # Federating with other local homeservers: a TLS listener on this port
    # (self-signed; peers do not verify it), and the server named after it.
    federates: bool = False
    federation_port: int = 0
    # Where peers reach it, when not at ``federation_port`` (a relay in front).
    reached_at: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_name(self) -> str:
        """``localhost:<federation port>`` when federating (peers reach it
        there, no discovery needed), else ``localhost``."""
        return f"localhost:{self.reached_at or self.federation_port}" if self.federates else SERVER_NAME

    @property
    def config_path(self) -> Path:
        return self.data_dir / "homeserver.yaml"

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        secret_file = self.data_dir / "shared_secret"
        if not secret_file.exists():
            secret_file.write_text(secrets.token_hex(24))
        self.shared_secret = secret_file.read_text().strip()
        if self.federates and not self.federation_port:
            self.federation_port = free_port()
        config: dict[str, Any] = {
            "server_name": self.server_name,
            "pid_file": str(self.data_dir / "homeserver.pid"),
            "listeners": [{
                "port": self.port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }] + ([{
                "port": self.federation_port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": True,
                "x_forwarded": False,
                "resources": [{"names": ["federation", "keys"], "compress": False}],
            }] if self.federates else []),
            "database": {"name": "sqlite3", "args": {"database": str(self.data_dir / "homeserver.db")}},
            "media_store_path": str(self.data_dir / "media"),
            "signing_key_path": str(self.data_dir / "signing.key"),
            "log_config": str(self._write_log_config()),
            "registration_shared_secret": self.shared_secret,
            "report_stats": False,
            "trusted_key_servers": [],
            "suppress_key_server_warning": True,
            "enable_metrics": False,
            "bcrypt_rounds": 4,
            "url_preview_enabled": False,
            "presence": {"enabled": False},
            "app_service_config_files": list(self.appservice_files),
            # What the bridge's encryption in appservice mode needs: to-device
            # messages, device lists and one-time-key counts in transactions.
            "experimental_features": {"msc2409_to_device_messages_enabled": True,
                                      "msc3202_transaction_extensions": True},
            **_relaxed_limits(self.rate_limit_per_second),
            **(self._federation_config() if self.federates else {}),
            **({"max_event_delay_duration": "7d"} if self.delayed_events else {}),
            **self.extra_config,
        }
        self.config_path.write_text(yaml.safe_dump(config))

    def _federation_config(self) -> dict[str, Any]:
        cert, key = _self_signed_certificate(self.data_dir)
        return {
            "tls_certificate_path": str(cert),
            "tls_private_key_path": str(key),
            "federation_verify_certificates": False,
            # The peers are on loopback, which Synapse refuses to reach by default.
            "ip_range_whitelist": ["127.0.0.1/32", "::1/128"],
            # A peer that was down is tried again within seconds rather than
            # Synapse's default ten minutes (the peer's own requests also
            # mark it up at once): a test's restarted peer is not shunned.
            "federation": {"destination_min_retry_interval": "1s", "destination_retry_multiplier": 1.5,
                           "destination_max_retry_interval": "5s"},
        }

    def _write_log_config(self) -> Path:
        path = self.data_dir / "log.yaml"
        path.write_text(yaml.safe_dump({
            "version": 1,
            "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
            "handlers": {"file": {"class": "logging.FileHandler", "formatter": "plain",
                                  "filename": str(self.data_dir / "homeserver.log")}},
            "root": {"level": "WARNING", "handlers": ["file"]},
            "disable_existing_loggers": False,
        }))
        return path

    def start(self, timeout: float = 60) -> None:
        for attempt in range(3):
            # A port picked here can be picked by another process in the
            # moment between (two test workers each starting a homeserver):
            # then this one can't listen, and it starts again on another.
            picked = not self.port
            self.write_config()
            if not (self.data_dir / "signing.key").exists():
                subprocess.run(
                    [sys.executable, "-m", "synapse.app.homeserver", "-c", str(self.config_path), "--generate-keys"],
                    check=True, capture_output=True,
                )
            out = open(self.data_dir / "stdout.log", "ab")
            self.process = subprocess.Popen(
                [sys.executable, "-m", "synapse.app.homeserver", "-c", str(self.config_path)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                self.wait_ready(timeout)
                return
            except PortTaken:
                if not picked or attempt == 2:
                    raise
                self.port = 0
            except BaseException:
                # Not ready in time, or Ctrl-C while it started: it runs in a
                # session of its own, which no terminal's Ctrl-C reaches, and
                # was left serving with no one to stop it.
                self.stop()
                raise

    def wait_ready(self, timeout: float) -> None:
        """Until this process serves its port: another homeserver answering
        there (it took the port first) is not this one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                log = (self.data_dir / "stdout.log").read_text(errors="replace")[-3000:]
                if f"Failed to listen on TCP port ({self.port})" in log:
                    raise PortTaken(f"port {self.port} was taken by another process:\n{log}")
                raise RuntimeError(f"Synapse exited with {self.process.returncode}:\n{log}")
            try:
                with urllib.request.urlopen(f"{self.url}/_matrix/client/versions", timeout=1):
                    if self.process is None or listens(self.process.pid, self.port):
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Synapse did not answer on {self.url} within {timeout} s")

    def stop(self, timeout: float = 20) -> None:
        if not self.process or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    # -- accounts ---------------------------------------------------------

    def register(self, localpart: str, password: str | None = None, admin: bool = False) -> dict[str, str]:
        """Register a user with the shared secret; returns user_id, access_token, password."""
        password = password or secrets.token_urlsafe(12)
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        nonce = _http_json("GET", endpoint)["nonce"]
        # The MAC is over the parts separated by NUL, without a trailing one.
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join(p.encode() for p in (nonce, localpart, password, "admin" if admin else "notadmin")))
        body = {"nonce": nonce, "username": localpart, "password": password, "admin": admin,
                "mac": mac.hexdigest()}
        reply = _http_json("POST", endpoint, body)
        return {"user_id": reply["user_id"], "access_token": reply["access_token"], "password": password,
                "device_id": reply.get("device_id", "")}

    def create_room(self, token: str, invite: list[str] = (), **extra: Any) -> str:
        body = {"preset": "private_chat", "invite": list(invite), **extra}
        return _http_json("POST", f"{self.url}/_matrix/client/v3/createRoom", body, token)["room_id"]

    def invite(self, token: str, room: str, user_id: str) -> None:
        quoted = urllib.request.quote(room, safe="")
        _http_json("POST", f"{self.url}/_matrix/client/v3/rooms/{quoted}/invite", {"user_id": user_id}, token)

    def join(self, token: str, room: str) -> str:
        quoted = urllib.request.quote(room, safe="")
        return _http_json("POST", f"{self.url}/_matrix/client/v3/join/{quoted}", {}, token)["room_id"]

    def __enter__(self) -> "Synapse":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _self_signed_certificate(data_dir: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` and its key, made once per data folder."""
    cert_path, key_path = data_dir / "federation.crt", data_dir / "federation.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    import datetime  # noqa: PLC0415 - only a federating server needs these

    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _http_json(method: str, url: str, body: Any = None, token: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise RuntimeError(f"{method} {url.split('?')[0]} -> {exc.code}: {detail}") from None
