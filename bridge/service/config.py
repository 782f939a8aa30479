"""The bridge's YAML configuration, read into typed sections (``sections``).

The user's file is merged over the commented example's defaults, so a minimal
file works and every key has one documented meaning.  Secrets may come from
the environment instead of the file (see ``ENV_SECRETS``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from dataclasses import field
from typing import Any, Literal

import yaml

from bridge.protocol.userids import user_id_problem
from bridge.service.sections import Duration, Invalid, Section, parse_duration
from bridge.service.yamlfile import load_yaml

# Environment variables that override (or stand in for) secrets in the file.
ENV_SECRETS = {
    "ASKWRIGHT_BRIDGE_ACCESS_TOKEN": ("bot", "access_token"),
    "ASKWRIGHT_BRIDGE_PASSWORD": ("bot", "password"),
    "ASKWRIGHT_BRIDGE_AS_TOKEN": ("appservice", "as_token"),
    "ASKWRIGHT_BRIDGE_HS_TOKEN": ("appservice", "hs_token"),
    "ASKWRIGHT_BRIDGE_STORE_PASSWORD": ("store", "password"),
}


class ConfigError(Exception):
    """One clear sentence naming the key at fault."""


class Homeserver(Section):
    url: str

    def check(self) -> None:
        from urllib.parse import urlsplit

        if not self.url.lower().startswith(("http://", "https://")):
            raise Invalid("must start with http:// or https://", "url")
        # No host, or a port that is no number: a traceback at the first request, where a line here says why.
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises for a port that is no number
        except ValueError:
            raise Invalid("names no port a connection can be made to (such as https://matrix.example.org:8448)",
                          "url") from None
        if not parts.hostname:
            raise Invalid("names no host (such as https://matrix.example.org)", "url")
        self.url = self.url.rstrip("/")


class Bot(Section):
    user_id: str
    access_token: str | None = None
    password: str | None = None
    device_name: str = "askwright-bridge"

    def check(self) -> None:
        from bridge.protocol.userids import user_id_problem  # pure, and small

        if user_id_problem(self.user_id):
            raise Invalid("must be a full Matrix user id such as @askbot:example.org", "user_id")
        for name in ("access_token", "password"):
            value = getattr(self, name)
            if value is not None and value.strip(". <>") == "":
                # config.example.yaml's "...": a token, it is used before the
                # password and the homeserver failed on it (Synapse: HTTP 500),
                # which read as a wrong homeserver.url.
                raise Invalid(f"{value!r} is the example's placeholder: give the real one, or leave the line out",
                              name)


class Sets(Section):
    root: Path

    def root_problem(self) -> str | None:
        """What ``run`` refuses at once: a root that is no folder (the bridge
        said it was ready, and its watch failed again and again)."""
        if self.root.is_dir():
            return None
        return f"sets.root: {self.root} is not a folder (create it, or name the folder the set folders are in)"


class Rooms(Section):
    default: str
    sets: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        if not self.default.startswith(("!", "#")):
            raise Invalid("must be a room id (!...) or an alias (#...)", "default")
        # A set's room too: one that is neither was joined in vain, warned of
        # over and over, and the set never posted.
        for set_id, room in self.sets.items():
            if not isinstance(room, str) or not room.startswith(("!", "#")):
                raise Invalid("must be a room id (!...) or an alias (#...)", "sets", str(set_id))


class Store(Section):
    """SQLite at ``path`` (the default), or PostgreSQL at ``url`` when set.
    ``path`` still names where the encryption keys (``<path>.crypto/``) live."""

    path: Path
    url: str | None = None
    password: str | None = None  # for ``url``; or ASKWRIGHT_BRIDGE_STORE_PASSWORD

    def check(self) -> None:
        if self.url is not None and not self.url.startswith(("postgresql://", "postgres://")):
            raise Invalid("must start with postgresql:// (leave it out for SQLite at store.path)", "url")
        if self.url is not None:
            from psycopg import Error
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(self.url)
            except Error:  # its words quote the part it can't read: the password, often
                raise Invalid("can't be read as a PostgreSQL URL: percent-encode the special characters of "
                              "its password (% as %25, @ as %40, / as %2F)", "url") from None

    @property
    def where(self) -> str:
        """The store as named in messages: the path, or the URL without a password."""
        if self.url:
            from bridge.service.storage.pgdialect import redact

            return redact(self.url)
        return str(self.path)


class Logging(Section):
    level: str = "INFO"
    format: str = "text"

    def check(self) -> None:
        if self.level.upper() not in LOG_LEVELS:
            raise Invalid(f"must be one of {', '.join(LOG_LEVELS)}", "level")
        if self.format not in ("text", "json"):
            raise Invalid("must be text or json", "format")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    # An IPv6 address is written in brackets ([::1]:9464); it is bound without them.
    return host.removeprefix("[").removesuffix("]") or "127.0.0.1", int(port)


def listen_refused(key: str, listen: str, exc: OSError) -> str:
    """One line for an address the bridge can't listen on (taken, not this machine's)."""
    return f"{key}: {listen} can't be listened on ({exc.strerror or exc}); free it or name another"


def _check_listen(value: str, lowest: int = 1) -> None:
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not lowest <= int(port) < 65536:
        raise Invalid("must be host:port, such as 127.0.0.1:9464", "listen")


class Appservice(Section):
    enabled: bool = False
    id: str = "askwright"
    url: str = "http://127.0.0.1:29331"
    listen: str = "127.0.0.1:29331"
    sender_localpart: str = "askbot"
    as_token: str | None = None
    hs_token: str | None = None

    def check(self) -> None:
        # Read at the start; unchecked, a bad one stopped the bridge with a traceback.
        _check_listen(self.listen, lowest=0)  # (0: any free port, which tests use)
        if not self.url.startswith(("http://", "https://")):
            raise Invalid("must start with http:// or https:// (where the homeserver reaches the bridge)", "url")

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return _host_port(self.listen)


class Metrics(Section):
    """Prometheus metrics at /metrics and liveness at /health.  In appservice
    mode both are served on the appservice listener and ``listen`` is unused."""

    enabled: bool = False
    listen: str = "127.0.0.1:9464"

    def check(self) -> None:
        _check_listen(self.listen)

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return _host_port(self.listen)


class Attachments(Section):
    """Files people send into a question's thread (``<set>/attachments/``):
    ``max_bytes`` is the largest one kept."""

    minimum = {"max_bytes": 1}
    max_bytes: int = 20 * 1024 * 1024


class Reminders(Section):
    """A nudge in the thread of a question posted ``after`` ago and still
    unanswered, repeated at most once every ``every``."""

    enabled: bool = False
    after: Duration = Duration("24h")
    every: Duration = Duration("24h")

    @property
    def after_seconds(self) -> float:
        return parse_duration(self.after)

    @property
    def every_seconds(self) -> float:
        return parse_duration(self.every)


class Encryption(Section):
    """End-to-end encryption, in bot mode and in appservice mode (which needs
    the homeserver's appservice extensions; docs/encryption.md).

    ``trust`` decides which devices get the room keys of the bridge's
    messages: ``cross-signed`` only devices their owner cross-signed (answers
    from any other device are refused); ``tofu`` trusts a device the first
    time its keys are seen and never accepts other keys for it; ``verified``
    only the devices listed in ``verified_devices`` (answers from any other
    device are refused); ``all`` every device of every member, with no pinning.
    ``cross_signing_keys`` is the file of the bridge's own cross-signing
    keys (default: ``<store.path>.cross-signing.json``).
    """

    enabled: bool = True
    trust: Literal["cross-signed", "tofu", "verified", "all"] = "cross-signed"
    cross_signing_keys: str | None = None
    # user id -> device id -> ed25519 fingerprint (Element: Settings, Sessions, "Session key").
    verified_devices: dict[str, dict[str, str]] = field(default_factory=dict)
    grace: Duration = Duration("60s")

    def check(self) -> None:
        # Element shows the key in groups of four separated by spaces.
        self.verified_devices = {user: {device: "".join(key.split()) for device, key in devices.items()}
                                 for user, devices in self.verified_devices.items()}

    @property
    def grace_seconds(self) -> float:
        return parse_duration(self.grace)


_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Audit(Section):
    """The verifiable answer log (docs/audit.md): every outcome appends a
    leaf; whenever the log grew, at most every ``checkpoint_every``, a
    checkpoint signed with the key in ``key_file`` (default
    ``<store.path>.log-key``, mode 0600, never in the store) is put in every
    room the bridge posts in."""

    enabled: bool = True
    checkpoint_every: Duration = Duration("1m")
    key_file: str | None = None

    @property
    def checkpoint_seconds(self) -> float:
        return parse_duration(self.checkpoint_every)


class Agent(Section):
    """One agent allowed in through the HTTP API or MCP at /mcp.  ``token`` is
    its bearer token; ``webhook_url`` (optional) is told of every accepted
    answer to its sets, each POST signed with ``webhook_secret``."""

    token: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None

    def check(self) -> None:
        if self.webhook_url is not None and not self.webhook_url.startswith(("http://", "https://")):
            raise Invalid("must start with http:// or https://", "webhook_url")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("the token must be at least 16 characters")

    def missing_secret(self) -> str | None:
        if not self.token:
            return "needs a token (or its environment variable, see docs/agents.md)"
        if self.webhook_url and not self.webhook_secret:
            return "webhook_url needs webhook_secret to sign the deliveries"
        return None


class AgentApi(Section):
    """Limits of the agents' HTTP API and MCP endpoint, and of webhook delivery."""

    minimum = {"rate_per_minute": 1, "max_waits": 1, "max_waits_total": 1, "media_max": 1, "media_quota": 1}
    # Requests per minute per agent (a bucket that holds a minute's worth).
    # A wait that waits gives its request back: the caps below bound waits.
    rate_per_minute: int = 120
    # Waits (HTTP long polls and MCP wait calls) one agent may hold at once,
    # and all agents together; over either, 429 with Retry-After.
    max_waits: int = 100
    max_waits_total: int = 1000
    # The largest media file an agent may upload for its set, in bytes.
    media_max: int = 100 * 1024 * 1024
    # The bytes all of one agent's set folders may hold (its media, its sets'
    # files, people's files in them): one agent can't fill the disk for the others.
    media_quota: int = 10 * 1024 ** 3
    # A webhook not taken after this long is dropped, with a log line and a metric.
    webhook_drop_after: Duration = Duration("24h")
    webhook_timeout: Duration = Duration("10s")
    # Webhook and callback URLs may go to loopback, private, link-local or
    # metadata addresses (refused otherwise, at configuration, ask and delivery).
    allow_private_callbacks: bool = False
    # The address agents reach the bridge at (https://bridge.example.org): /mcp
    # answers only requests whose Host and Origin name it (or the listener, or
    # an IP address), so no other site's page can reach it by DNS rebinding.
    public_url: str | None = None

    def check(self) -> None:
        if self.public_url is not None:
            from urllib.parse import urlsplit

            parts = urlsplit(self.public_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise Invalid("must be an http:// or https:// URL with a host, such as https://bridge.example.org",
                              "public_url")

    @property
    def drop_after_seconds(self) -> float:
        return parse_duration(self.webhook_drop_after)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.webhook_timeout)


def _webhook_goes_outward(name: str, agent: Agent) -> None:
    """What the config itself can tell of a webhook_url: an inward address or
    localhost is refused here; a name is resolved and checked when the bridge
    starts, and at every delivery (bridge/agents/callbacks.py)."""
    from bridge.agents.addresses import host_of_url, refusal_of_name  # pure, and small

    host = host_of_url(agent.webhook_url) if agent.webhook_url else None
    if host is not None and (why := refusal_of_name(host)):
        raise Invalid(f"goes to {host}, {why}; agent_api.allow_private_callbacks: true allows it",
                      "agents", name, "webhook_url")


def agent_env_prefix(name: str) -> str:
    """ASKWRIGHT_BRIDGE_AGENT_<NAME>_: the name upper-cased, other characters as _."""
    return "ASKWRIGHT_BRIDGE_AGENT_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_"


class Config(Section):
    homeserver: Homeserver
    bot: Bot
    sets: Sets
    rooms: Rooms
    answerers: list[str] = field(default_factory=list)
    admins: list[str] = field(default_factory=list)
    store: Store
    logging: Logging = field(default_factory=Logging)
    appservice: Appservice = field(default_factory=Appservice)
    metrics: Metrics = field(default_factory=Metrics)
    reminders: Reminders = field(default_factory=Reminders)
    attachments: Attachments = field(default_factory=Attachments)
    encryption: Encryption = field(default_factory=Encryption)
    audit: Audit = field(default_factory=Audit)
    agents: dict[str, Agent] = field(default_factory=dict)
    agent_api: AgentApi = field(default_factory=AgentApi)

    def check(self) -> None:
        for name in self.agents:
            if not _AGENT_NAME.fullmatch(name):
                raise Invalid(f"agent name {name!r} must be letters, digits, _, . or - (64 at most)", "agents")
            if not self.agent_api.allow_private_callbacks:
                _webhook_goes_outward(name, self.agents[name])
        for key in ("answerers", "admins"):
            for user in getattr(self, key):
                # A misspelt id would match nobody, silently: an admin who is never one.
                problem = user_id_problem(user)
                if problem is not None:
                    raise Invalid(problem, key)
        if self.appservice.enabled:
            localpart = self.bot.user_id[1:].split(":", 1)[0]
            if localpart != self.appservice.sender_localpart:
                raise Invalid("must be the appservice's sender_localpart user", "bot", "user_id")

    def missing_secret(self) -> Invalid | None:
        """What the bridge cannot log in or let an agent in without; the
        commands that only read the store and the folders do without them."""
        if not self.appservice.enabled and not (self.bot.access_token or self.bot.password):
            return Invalid("needs access_token or password (or ASKWRIGHT_BRIDGE_ACCESS_TOKEN)", "bot")
        for name, agent in self.agents.items():
            problem = agent.missing_secret()
            if problem is not None:
                return Invalid(problem, "agents", name)
        return None

    @property
    def inviters(self) -> frozenset[str] | None:
        """Who may invite the bridge back into its rooms: answerers and admins,
        or anyone (None) when every member may answer."""
        return frozenset(self.answerers) | frozenset(self.admins) if self.answerers else None

    def room_for(self, set_id: str) -> str:
        return self.rooms.sets.get(set_id, self.rooms.default)

    @property
    def server_name(self) -> str:
        return self.bot.user_id.split(":", 1)[1]


def load_config(path: str | Path, environ: dict[str, str] | None = None, *, secrets: bool = True) -> Config:
    """The config at ``path``; ``secrets`` false for a command that only reads
    the store and the folders, which an operator may run without the tokens."""
    path = Path(path)
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the config file is not UTF-8 (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping")
    return parse_config(raw, base_dir=path.parent, environ=os.environ if environ is None else environ, source=str(path),
                        secrets=secrets)


def parse_config(raw: dict[str, Any], *, base_dir: Path, environ: dict[str, str], source: str = "config",
                 secrets: bool = True) -> Config:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for var, (section, key) in ENV_SECRETS.items():
        if environ.get(var):
            raw.setdefault(section, {})
            if isinstance(raw[section], dict):
                raw[section][key] = environ[var]
    _agent_secrets(raw, environ, source)
    try:
        config = Config.read(raw)
        missing = config.missing_secret() if secrets else None
        if missing is not None:
            raise missing
    except Invalid as exc:
        raise ConfigError(f"{source}: {'.'.join(exc.path) or '(top level)'}: {exc.message}") from None
    tokens: dict[str, str] = {}
    for name, agent in config.agents.items():
        if agent.token is None:
            continue
        if agent.token in tokens:
            # The token is who the agent is: the second was taken for the first.
            raise ConfigError(f"{source}: agents.{name}.token is the token of agents.{tokens[agent.token]} too: "
                              "each agent needs its own")
        tokens[str(agent.token)] = name
    # Relative paths are relative to the config file, not the working directory.
    config.sets.root = (base_dir / config.sets.root).resolve()
    config.store.path = (base_dir / config.store.path).resolve()
    if config.encryption.cross_signing_keys:
        config.encryption.cross_signing_keys = str((base_dir / config.encryption.cross_signing_keys).resolve())
    if config.audit.key_file:
        config.audit.key_file = str((base_dir / config.audit.key_file).resolve())
    return config


def _agent_secrets(raw: dict[str, Any], environ: dict[str, str], source: str = "config") -> None:
    """ASKWRIGHT_BRIDGE_AGENT_<NAME>_TOKEN and ..._WEBHOOK_SECRET for each agent named in the file."""
    agents = raw.get("agents")
    if not isinstance(agents, dict):
        return
    named: dict[str, str] = {}
    for name, section in list(agents.items()):
        prefix = agent_env_prefix(str(name))
        if prefix in named:
            raise ConfigError(f"{source}: agents: {named[prefix]!r} and {name!r} share the environment variables {prefix}…: "
                              "rename one (their secrets would be taken for both)")
        named[prefix] = str(name)
        for key in ("token", "webhook_secret"):
            value = environ.get(prefix + key.upper())
            if value:
                section = dict(section) if isinstance(section, dict) else {}
                section[key] = value
                agents[name] = section
    raw["agents"] = agents


def world_readable(path: str | Path) -> bool:
    """True when others can read the file that holds secrets."""
    try:
        return bool(Path(path).stat().st_mode & (stat.S_IROTH | stat.S_IRGRP))
    except OSError:
        return False
