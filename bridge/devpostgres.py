"""A throwaway local PostgreSQL server: what the test suite and the
benchmarks run the PostgreSQL store against.

It is a real server from the distribution's packages (``initdb``, ``pg_ctl``)
in a temporary folder, listening on 127.0.0.1 only, with password
authentication.  PostgreSQL refuses to run as root, so as root the server is
run as the ``postgres`` user (``runuser``) and its folder handed to it.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from bridge.devserver import free_port

SUPERUSER = "postgres"


def bin_dir() -> Path:
    """Where initdb and pg_ctl are: on PATH, or Debian's versioned folder."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if not versions:
        raise RuntimeError("PostgreSQL is not installed (no initdb found); install the postgresql package")
    return Path(versions[-1]).parent


@dataclass
class Postgres:
    """One server process with its data in a folder of its own."""

    durable: bool = False  # fsync on: for benchmarks; tests do without it
    port: int = 0
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    folder: Path | None = None

    @property
    def data_dir(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    def url(self, database: str = "postgres", *, with_password: bool = False) -> str:
        secret = f":{quote(self.password, safe='')}" if with_password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *argv: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", SUPERUSER, "--", *argv]
        return list(argv)

    def start(self, timeout: float = 60) -> None:
        # Not under the test's own temporary folder: its parents are private
        # to root, and the server runs as another user.
        self.folder = Path(tempfile.mkdtemp(prefix="askwright-pg-"))
        pwfile = self.folder / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.folder, SUPERUSER, SUPERUSER)
            shutil.chown(pwfile, SUPERUSER, SUPERUSER)
        pwfile.chmod(0o600)
        tools = bin_dir()
        subprocess.run(self._as_owner(str(tools / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                                      "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8",
                                      "--locale=C", "--no-sync"),
                       check=True, capture_output=True)
        self.port = self.port or free_port()
        self._run_server(timeout)

    def _run_server(self, timeout: float) -> None:
        assert self.folder is not None
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1", "-c unix_socket_directories=''",
                   "-c max_connections=200", "-c shared_buffers=32MB"]
        if not self.durable:
            options += ["-c fsync=off", "-c full_page_writes=off"]
        subprocess.run(self._as_owner(str(bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-l",
                                      str(self.folder / "server.log"), "-o", " ".join(options),
                                      "-w", "-t", str(int(timeout)), "start"),
                       check=True, capture_output=True)
        self._wait_ready(timeout)

    def restart(self, down_for: float = 0.0, timeout: float = 60) -> None:
        """Stop the server (every connection is cut), stay down ``down_for``
        seconds, and start it again on the same port with the same data."""
        assert self.folder is not None
        subprocess.run(self._as_owner(str(bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast",
                                      "-w", "stop"), check=True, capture_output=True)
        time.sleep(down_for)
        self._run_server(timeout)

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url(with_password=True), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL (without the password)."""
        import psycopg

        name = name or f"t_{secrets.token_hex(6)}"
        with psycopg.connect(self.url(with_password=True), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.folder is None:
            return
        subprocess.run(self._as_owner(str(bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate",
                                      "-w", "stop"), capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> "Postgres":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
